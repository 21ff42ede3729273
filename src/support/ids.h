// Strong integer ids: OpId names an op of an ir::Graph across library boundaries. Stages and
// devices stay plain ints (plan::Stage::id, devices): they index Plan::stages and are ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>

namespace gp {

template <class Tag>
struct Id {
  int32_t v = -1;
  constexpr Id() = default;
  constexpr explicit Id(int32_t value) : v(value) {}
  constexpr bool valid() const { return v >= 0; }
  constexpr auto operator<=>(const Id&) const = default;
  friend std::ostream& operator<<(std::ostream& os, Id id) { return os << id.v; }
};

using OpId = Id<struct OpTag>;

}  // namespace gp

template <class Tag>
struct std::hash<gp::Id<Tag>> {
  size_t operator()(gp::Id<Tag> id) const noexcept { return std::hash<int32_t>{}(id.v); }
};
