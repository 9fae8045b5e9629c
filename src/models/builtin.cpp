// The list of built-in token mixers and model families: explicit registration calls, one per
// file, so nothing depends on static initialisers the linker may drop.
#include "models/model.h"

namespace ska::models {

// src/nn/mixers/*.cpp
void register_attention_mixers(Registry<MixerBuilder>& r);  // mhsa
void register_lsa_mixer(Registry<MixerBuilder>& r);         // lsa
void register_ska_mixer(Registry<MixerBuilder>& r);         // ska
void register_cska_mixer(Registry<MixerBuilder>& r);        // cska
void register_sepconv_mixer(Registry<MixerBuilder>& r);     // sepconv
void register_pooling_mixers(Registry<MixerBuilder>& r);    // pooling, identity
void register_aft_mixers(Registry<MixerBuilder>& r);        // aft_full, aft_simple, aft_local, aft_conv
void register_sra_mixer(Registry<MixerBuilder>& r);         // sra

// src/models/*.cpp
void register_metaformer_family(Registry<FamilyBuilder>& r);
void register_vit_family(Registry<FamilyBuilder>& r);
void register_cait_family(Registry<FamilyBuilder>& r);
void register_swin_family(Registry<FamilyBuilder>& r);
void register_cvt_family(Registry<FamilyBuilder>& r);

void register_mixers(Registry<MixerBuilder>& r) {
  register_attention_mixers(r);
  register_lsa_mixer(r);
  register_ska_mixer(r);
  register_cska_mixer(r);
  register_sepconv_mixer(r);
  register_pooling_mixers(r);
  register_aft_mixers(r);
  register_sra_mixer(r);
}

void register_families(Registry<FamilyBuilder>& r) {
  register_metaformer_family(r);
  register_vit_family(r);
  register_cait_family(r);
  register_swin_family(r);
  register_cvt_family(r);
}

}  // namespace ska::models
