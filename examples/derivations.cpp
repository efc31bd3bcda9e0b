// derivations: every op's backward, explained and checked. For each op it
// prints its section of docs/derivations.md (read from the file itself: one
// source for the page and this program), then runs gradcheck on the op's first
// row of the op table (tests/op_table.cpp) and shows the analytic and the
// numeric gradient side by side.
//
//   derivations              every op
//   derivations --op softmax one op
//   derivations --layer      the attention layer's backward, node by node, in
//                            the order the engine runs them
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "tapegrad.h"
#include "tests/op_table.h"

namespace {

struct Section {
  std::string title, text;
};

// The page's "## " sections.
std::vector<Section> read_sections(const std::string& path) {
  std::ifstream in(path);
  TG_CHECK(in, "derivations: cannot read ", path);
  std::vector<Section> sections;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) sections.push_back({line.substr(3), ""});
    else if (!sections.empty()) sections.back().text += line + "\n";
  }
  return sections;
}

// The section that names op's test `gradcheck/<op>`.
const Section* section_of(const std::vector<Section>& sections, tg::OpId op) {
  const std::string test = "`gradcheck/" + std::string(tg::op_name(op)) + "`";
  for (const Section& s : sections)
    if (s.text.find(test) != std::string::npos) return &s;
  return nullptr;
}

double norm(const tg::Tensor& t) {
  double s = 0;
  for (double v : t.to_vector()) s += v * v;
  return std::sqrt(s);
}

// Whether the gradcheck passed (true where it needs a GPU and is not run).
bool show_gradcheck(tg::OpId op) {
  const auto cases = tgtest::cases_of(op, tgtest::kGradcheck);
  if (cases.empty() || cases.front()->needs_cuda) {
    std::printf("  (gradcheck needs a GPU for this op)\n");
    return true;
  }
  const tgtest::OpCase& c = *cases.front();
  const tgtest::Dims dims = tgtest::dims_for(tgtest::kGradcheck);
  tg::manual_seed(0);
  const tgtest::V inputs = tgtest::make_inputs(c, tgtest::kGradcheck, tg::DType::Float64);
  const tg::GradcheckResult r =
      tg::gradcheck([&](const tgtest::V& t) { return c.run(t, dims); }, inputs, c.gradcheck_eps);
  std::printf("  gradcheck on \"%s\": %s (%ld elements, worst error %.2g of the tolerance)\n", c.variant.c_str(),
              r.ok ? "ok" : "FAILED", static_cast<long>(r.elements_checked), r.max_error);
  std::printf("    %-6s %-6s %16s %16s %10s\n", "input", "index", "analytic", "numeric", "|diff|");
  std::map<size_t, int> shown;
  for (const tg::GradcheckEntry& e : r.entries)
    if (shown[e.input]++ < 4)
      std::printf("    %-6zu %-6ld %16.10f %16.10f %10.2e\n", e.input, static_cast<long>(e.index), e.analytic, e.numeric,
                  std::abs(e.analytic - e.numeric));
  return r.ok;
}

bool show_op(const std::vector<Section>& sections, tg::OpId op, bool with_text) {
  std::printf("\n=== %s\n", tg::op_name(op));
  const Section* s = section_of(sections, op);
  if (with_text && s) std::printf("--- docs/derivations.md, \"%s\"\n%s", s->title.c_str(), s->text.c_str());
  return show_gradcheck(op);
}

// A tiny decomposed layer in float64, its backward observed node by node.
void walk_layer() {
  tg::manual_seed(1);
  const tg::TensorOptions f64{tg::DType::Float64};
  const tg::RegionAttentionParams p = tg::RegionAttentionParams::init({8, 2, 6}, f64);
  const tg::Tensor x = tg::randn({2, 5, 8}, f64).requires_grad_();
  const tg::Tensor e = tg::from_vector({1, 1, 0, 0, 1, 0, 1, 1, 0, 0}, {2, 5}, f64), a = tg::ones({2, 5}, f64);
  const tg::Tensor y = tg::region_attention_decomposed(x, e, a, p, {0.1, tg::PhiloxState{1, 1}});
  std::printf("the attention layer (B=2, S=5, C=8, H=2) as the engine runs its backward, root first:\n");
  std::printf("%-4s %-12s %-14s %10s   %s\n", "#", "node", "dL/d(out)", "|dL/dout|", "gradients it sends: shape |norm|");
  int n = 0;
  const tg::autograd::ObserveBackward observe(
      [&](const tg::autograd::Node& node, const tg::Tensor& g, const std::vector<tg::Tensor>& grads) {
        std::ostringstream sent;
        for (const tg::Tensor& t : grads)
          if (t.defined()) sent << tg::to_string(t.shape()) << " " << std::setprecision(3) << norm(t) << "  ";
        std::printf("%-4d %-12s %-14s %10.4f   %s\n", ++n, node.name.c_str(), tg::to_string(g.shape()).c_str(), norm(g),
                    sent.str().c_str());
      });
  y.backward(tg::ones(y.shape(), f64));
}

// Exit status 1 when a gradcheck fails or the page cannot be read, 2 for an unknown op.
int run(const std::string& op, bool layer) {
  if (layer) {
    walk_layer();
    return 0;
  }
  const std::vector<Section> sections = read_sections(TG_SOURCE_DIR "/docs/derivations.md");
  if (!op.empty()) {
    for (int i = 0; i < tg::kOpCount; ++i)
      if (op == tg::kOpNames[i]) return show_op(sections, static_cast<tg::OpId>(i), true) ? 0 : 1;
    std::fprintf(stderr, "derivations: no op named '%s' (see autograd/op_list.h)\n", op.c_str());
    return 2;
  }
  bool ok = true;
  const Section* previous = nullptr;  // ops that share a section print it once
  for (int i = 0; i < tg::kOpCount; ++i) {
    const auto id = static_cast<tg::OpId>(i);
    const Section* s = section_of(sections, id);
    ok = show_op(sections, id, s != previous) && ok;
    previous = s;
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Every op's backward: the derivation, then gradcheck's analytic and numeric gradients"};
  std::string op;
  bool layer = false;
  CLI::Option* op_option = app.add_option("--op", op, "one op (a name from autograd/op_list.h, e.g. softmax)");
  op_option->check(CLI::Validator([](std::string& s) { return s.empty() ? "an op name, not an empty string" : ""; },
                                  "NAME"));
  app.add_flag("--layer", layer, "walk the attention layer's backward node by node")->excludes(op_option);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(op, layer);
  } catch (const std::exception& e) {  // tg::Error, and what the standard library throws
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
