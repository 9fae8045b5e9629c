// cvt: registration placeholder; the implementation is in progress.
#include "models/model.h"

namespace ska::models {

void register_cvt_family(Registry<FamilyBuilder>& r) {}

}  // namespace ska::models
