// lsa: registration placeholder; the implementation is in progress.
#include "models/model.h"

namespace ska::models {

void register_lsa_mixer(Registry<MixerBuilder>& r) {}

}  // namespace ska::models
