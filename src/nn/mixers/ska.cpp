// ska: registration placeholder; the implementation is in progress.
#include "models/model.h"

namespace ska::models {

void register_ska_mixer(Registry<MixerBuilder>& r) {}

}  // namespace ska::models
