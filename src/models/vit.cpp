// vit: registration placeholder; the implementation is in progress.
#include "models/model.h"

namespace ska::models {

void register_vit_family(Registry<FamilyBuilder>& r) {}

}  // namespace ska::models
