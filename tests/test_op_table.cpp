// gradcheck/<op>: every row of the op table (tests/op_table.cpp) against
// central differences in float64 on the CPU. One test case per op of
// autograd/op_list.h, generated from the list: an op without a row fails.
#include "helpers.h"
#include "op_table.h"

using namespace tgtest;

namespace {

void check_gradients(const OpCase& c, const V& inputs, const Dims& dims) {
  const tg::GradcheckResult r = tg::gradcheck([&](const V& t) { return c.run(t, dims); }, inputs, c.gradcheck_eps);
  INFO("worst element: " << r.report);
  CHECK(r.elements_checked > 0);
  CHECK(r.ok);
}

// Every row with all its differentiable inputs requiring grad, then with each
// one alone: the needs-grad mask decides what an op saves and computes, so
// every pattern of it must give the same gradients.
void run_gradcheck(tg::OpId op) {
  const std::vector<const OpCase*> cases = cases_of(op, kGradcheck);
  REQUIRE_MESSAGE(!cases.empty(), "op '" << tg::op_name(op) << "' has no gradcheck row in tests/op_table.cpp");
  const Dims dims = dims_for(kGradcheck);
  for (const OpCase* c : cases) {
    if (c->needs_cuda && !tg::cuda::is_available()) continue;  // the GPU suite runs it (gradcheck/ on CUDA)
    CAPTURE(case_name(*c));
    const V inputs = make_inputs(*c, kGradcheck, tg::DType::Float64);
    check_gradients(*c, inputs, dims);
    std::vector<size_t> differentiable;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad()) differentiable.push_back(i);
    if (differentiable.size() < 2) continue;
    for (size_t only : differentiable) {
      CAPTURE(only);
      V one = inputs;
      for (size_t i : differentiable) one[i] = inputs[i].detach().requires_grad_(i == only);
      check_gradients(*c, one, dims);
    }
  }
}

}  // namespace

#define TG_GRADCHECK_TEST(name) \
  TEST_CASE("gradcheck/" #name) { run_gradcheck(tg::OpId::name); }
TG_OP_LIST(TG_GRADCHECK_TEST)
#undef TG_GRADCHECK_TEST

TEST_CASE("ops/every op of the list has a gradcheck row and a CUDA parity row") {
  for (int i = 0; i < tg::kOpCount; ++i) {
    const auto op = static_cast<tg::OpId>(i);
    CAPTURE(tg::op_name(op));
    CHECK_FALSE(cases_of(op, kGradcheck).empty());
    CHECK_FALSE(cases_of(op, kParity).empty());
  }
}
