// Binds a reference into the temporary vector names() returns, as the GPU tests once did with
// variants().at(i): the check must fail on this source.
#include "probe.h"

int firstLength() {
  const std::string& first = names().at(0);
  return int(first.size());
}
