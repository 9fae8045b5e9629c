// The token-mixer registry: the list of built-in mixers (explicit registration calls, one per
// file) and building a mixer from its config node.
#include "nn/mixers/mixer.h"

#include <mutex>

namespace ska::nn {

// Defined next to each mixer (src/nn/mixers/*.cpp).
void register_attention_mixers(Registry<MixerBuilder>& r);  // mhsa, lsa
void register_ska_mixer(Registry<MixerBuilder>& r);         // ska
void register_cska_mixer(Registry<MixerBuilder>& r);        // cska
void register_sepconv_mixer(Registry<MixerBuilder>& r);     // sepconv
void register_pooling_mixers(Registry<MixerBuilder>& r);    // pooling, identity
void register_aft_mixers(Registry<MixerBuilder>& r);  // aft_full, aft_simple, aft_local, aft_conv
void register_sra_mixer(Registry<MixerBuilder>& r);   // sra

namespace {

Registry<MixerBuilder>& bare_registry() {
  static Registry<MixerBuilder>* r = new Registry<MixerBuilder>("token mixer");
  return *r;
}

}  // namespace

void register_builtin_mixers() {
  static std::once_flag once;
  std::call_once(once, [] {
    Registry<MixerBuilder>& r = bare_registry();
    register_attention_mixers(r);
    register_ska_mixer(r);
    register_cska_mixer(r);
    register_sepconv_mixer(r);
    register_pooling_mixers(r);
    register_aft_mixers(r);
    register_sra_mixer(r);
  });
}

Registry<MixerBuilder>& mixer_registry() {
  register_builtin_mixers();
  return bare_registry();
}

ModulePtr build_mixer_from_node(const ConfigNode& node, const MixerArgs& args) {
  if (node.is_map()) return mixer_registry().get(node, "type")(node, args);
  SKA_CHECK(node.is_scalar(), ConfigError, node.path(),
            ": expected a token mixer name or a map with `type:`");
  // The string form: the type with its defaults (a null node answers every option's fallback).
  return mixer_registry().get(node.as<std::string>(), node.path())(ConfigNode(), args);
}

ModulePtr build_mixer(const ConfigNode& parent, const std::string& key, const MixerArgs& args,
                      const std::string& default_type) {
  const ConfigNode node = parent[key];
  if (node.is_null() && !default_type.empty()) {
    return mixer_registry().get(
        default_type, parent.path().empty() ? key : parent.path() + "." + key)(ConfigNode(), args);
  }
  if (node.is_map()) return mixer_registry().get(node, "type")(node, args);
  return mixer_registry().get(parent, key)(ConfigNode(), args);
}

}  // namespace ska::nn
