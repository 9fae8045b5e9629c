// The registries and build_model.
#include "models/model.h"

#include <mutex>

namespace ska::models {

Registry<FamilyBuilder>& family_registry() {
  static Registry<FamilyBuilder>* r = new Registry<FamilyBuilder>("model family");
  return *r;
}

// The built-in families (src/models/builtin.cpp).
void register_families(Registry<FamilyBuilder>& families);

void register_builtin_models() {
  static std::once_flag once;
  std::call_once(once, [] {
    nn::register_builtin_mixers();
    register_families(family_registry());
  });
}

nn::ModulePtr build_model(const ConfigNode& cfg) {
  register_builtin_models();
  ModelInput input;
  input.image_size = cfg.get_int_in("image_size", 224, 8, 4096);
  input.in_channels = cfg.get_int_in("in_channels", 3, 1, 64);
  input.num_classes = cfg.get_int_in("num_classes", 1000, 1, 1000000);
  return family_registry().get(cfg, "family")(cfg, input);
}

}  // namespace ska::models
