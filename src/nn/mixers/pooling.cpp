// pooling: registration placeholder; the implementation is in progress.
#include "models/model.h"

namespace ska::models {

void register_pooling_mixers(Registry<MixerBuilder>& r) {}

}  // namespace ska::models
