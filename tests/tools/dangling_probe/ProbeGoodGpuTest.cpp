// Holds a copy: no dangling reference (the check passes on this source).
#include "probe.h"

int firstLength() {
  const std::string first = names().at(0);
  return int(first.size());
}
