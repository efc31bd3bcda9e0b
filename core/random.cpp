#include "core/random.h"

namespace tg {

Generator& default_generator() {
  static Generator gen;
  return gen;
}

}  // namespace tg
