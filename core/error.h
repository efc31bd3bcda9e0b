// tg::Error and the TG_CHECK macro: every bad input becomes an exception whose
// message names the op, the argument and the shapes or values involved.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tg {

// Shapes print as [2,3] in messages (defined in core/shape.cpp).
std::ostream& operator<<(std::ostream& os, const std::vector<int64_t>& shape);

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace tg

// TG_CHECK(cond, "op: ", "message parts", ...) throws tg::Error("op: message parts").
#define TG_CHECK(cond, ...)                                     \
  do {                                                          \
    if (!(cond)) throw ::tg::Error(::tg::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TG_FAIL(...) throw ::tg::Error(::tg::detail::concat(__VA_ARGS__))
