// The list of built-in model families: explicit registration calls, one per file, so nothing
// depends on static initialisers the linker may drop (the mixers' list: nn/mixers/mixer.cpp).
#include "models/model.h"

namespace ska::models {

// src/models/*.cpp
void register_metaformer_family(Registry<FamilyBuilder>& r);
void register_vit_family(Registry<FamilyBuilder>& r);
void register_cait_family(Registry<FamilyBuilder>& r);
void register_swin_family(Registry<FamilyBuilder>& r);
void register_cvt_family(Registry<FamilyBuilder>& r);

void register_families(Registry<FamilyBuilder>& r) {
  register_metaformer_family(r);
  register_vit_family(r);
  register_cait_family(r);
  register_swin_family(r);
  register_cvt_family(r);
}

}  // namespace ska::models
