// The main demo: trains the toy edit-diffusion model of models/edit_model.h
// ("recolour the shape inside the edit region to colour k") and shows what
// it learnt. Writes into --out: train.csv, loss.png, sample grids
// (samples_step<N>.png, samples_final.png), final.safetensors and
// checkpoint_step<N>.safetensors every --checkpoint-every steps (model,
// AdamW state, step, generator and the run's options: --resume continues one
// exactly, and refuses different options) and metrics.json, the held-out
// PSNR inside the edit region of the model and of two baselines.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "edit_figures.h"
#include "tapegrad.h"

namespace {

namespace fs = std::filesystem;
namespace toy = tg::toy;
using Clock = std::chrono::steady_clock;

// The held-out edits and their sampling noise: fixed, whatever --seed is.
constexpr uint64_t kHeldOutSeed = 1'000'003;
constexpr uint64_t kHeldOutNoiseSeed = 1'000'004;
constexpr int64_t kGridExamples = 6;
constexpr int64_t kMaxEdits = 1 << 16;  // per batch and held out
constexpr int64_t kMaxSteps = 1'000'000'000, kMaxDepth = 10'000;
// The checkpoint metadata key of the options a resumed run must share.
constexpr const char* kOptionsKey = "train_edit_diffusion.options";

struct Options {
  int64_t steps = 240;  // about two minutes on two CPU cores
  int64_t batch = 32;
  double lr = 2e-3;
  int64_t warmup = 0;  // set from --steps unless given
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  uint64_t seed = 0;
  tg::Device device = tg::Device::CPU;
  tg::AttentionImpl attention = tg::AttentionImpl::Decomposed;
  int64_t depth = 4;
  double mlp_ratio = 2.0;
  std::string out = "runs/edit_diffusion";
  std::string resume;
  int64_t sample_every = 80;
  int64_t eval_every = 0;
  int64_t checkpoint_every = 80;
  int64_t sample_steps = 20;
  int64_t heldout = 64;
};

// Checks that say what is wrong with a value: CLI11's PositiveNumber and
// NonNegativeNumber report "not in range 0 to 1797...(309 digits)", and its
// integer conversion saturates at the int64 maximum and reads 0x10 as 16 and
// 010 as 8. A whole number is read in decimal here and handed on as such
// (attach it with ->transform).
CLI::Validator whole_number(int64_t lowest, int64_t highest) {
  const std::string range = "[" + std::to_string(lowest) + ", " + std::to_string(highest) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (error != std::errc() || end != text.data() + text.size())
          return "'" + text + "' is not a whole number in " + range;
        if (v < lowest || v > highest) return text + " is not in " + range;
        text = std::to_string(v);
        return "";
      },
      range);
}

// A finite number above 0, or with zero_allowed at least 0.
CLI::Validator real_number(bool zero_allowed) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(v))
          return "'" + text + "' is not a finite number in a double's range";
        if (zero_allowed ? v >= 0 : v > 0) return "";
        return text + (zero_allowed ? " is negative" : " is not positive");
      },
      zero_allowed ? "NONNEGATIVE" : "POSITIVE");
}

void add_options(CLI::App& app, Options& o) {
  const CLI::Validator steps = whole_number(1, kMaxSteps), period = whole_number(0, kMaxSteps),
                       edits = whole_number(1, kMaxEdits);
  app.add_option("--steps", o.steps, "training steps (the length of the cosine schedule)")
      ->transform(steps)->capture_default_str();
  app.add_option("--batch", o.batch, "edits per step")->transform(edits)->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate of AdamW")->check(real_number(false))->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear warm-up steps (default: 5% of --steps)")->transform(period);
  app.add_option("--weight-decay", o.weight_decay, "AdamW's decoupled weight decay")
      ->check(real_number(true))->capture_default_str();
  app.add_option("--max-grad-norm", o.max_grad_norm, "gradient clipping")
      ->check(real_number(false))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the model's init, the training noise and the training edits")
      ->transform(whole_number(0, static_cast<int64_t>(kHeldOutSeed) - 1))  // the held-out seed is not a training seed
      ->capture_default_str();
  app.add_option("--device", o.device, "where to train")
      ->transform(CLI::CheckedTransformer(std::map<std::string, tg::Device>{{"cpu", tg::Device::CPU},
                                                                            {"cuda", tg::Device::CUDA}}))
      ->option_text("cpu|cuda (default cpu)");
  app.add_option("--attention", o.attention, "the attention core: a graph of small ops, or one fused op")
      ->transform(CLI::CheckedTransformer(std::map<std::string, tg::AttentionImpl>{
          {"decomposed", tg::AttentionImpl::Decomposed}, {"fused", tg::AttentionImpl::Fused}}))
      ->option_text("decomposed|fused (default decomposed)");
  app.add_option("--depth", o.depth, "DiT blocks")->transform(whole_number(1, kMaxDepth))->capture_default_str();
  app.add_option("--mlp-ratio", o.mlp_ratio, "the blocks' MLP width over the hidden width 128")
      ->check(real_number(false))->capture_default_str();
  app.add_option("--out", o.out, "output folder")->capture_default_str();
  app.add_option("--resume", o.resume, "checkpoint to continue from (with the options of the run that wrote it)")
      ->check(CLI::ExistingFile);
  app.add_option("--sample-every", o.sample_every, "steps between sample grids (0: only at the end)")
      ->transform(period)->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between held-out evaluations (0: only at the end)")
      ->transform(period)->capture_default_str();
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "steps between checkpoint_step<N>.safetensors (0: only final.safetensors)")
      ->transform(period)->capture_default_str();
  app.add_option("--sample-steps", o.sample_steps, "Euler steps of the sampler")
      ->transform(steps)->capture_default_str();
  app.add_option("--heldout", o.heldout, "held-out edits for the PSNR table")->transform(edits)->capture_default_str();
}

std::string minutes_seconds(double seconds) {
  const auto s = static_cast<int64_t>(std::lround(std::max(seconds, 0.0)));
  std::ostringstream os;
  os << s / 60 << ":" << std::setw(2) << std::setfill('0') << s % 60;
  return os.str();
}

bool every(int64_t period, int64_t step) { return period > 0 && step % period == 0; }

// Progress of the training loop: on a terminal one line redrawn in place
// (step, bar, the loss's moving average, steps/s, ETA); otherwise a log line
// every 5%. The per-step losses are in train.csv.
class Progress {
 public:
  Progress(int64_t first_step, int64_t total_steps)
      : tty_(::isatty(STDOUT_FILENO) != 0), first_(first_step), total_(total_steps), start_(Clock::now()) {}

  void update(int64_t step, double loss, double lr, double grad_norm) {
    smoothed_ = step == first_ + 1 ? loss : 0.9 * smoothed_ + 0.1 * loss;
    const double rate = steps_per_second(step);
    std::ostringstream os;
    os << "step " << std::setw(5) << step << "/" << total_ << std::fixed << std::setprecision(4) << "  loss (ema) "
       << smoothed_ << std::setprecision(2) << "  " << rate << " steps/s  ETA "
       << minutes_seconds(static_cast<double>(total_ - step) / rate);
    if (tty_) {
      std::cout << "\r\033[K" << bar(step) << " " << os.str() << std::flush;
    } else if (step == total_ || step % std::max<int64_t>(1, total_ / 20) == 0) {
      std::cout << os.str() << std::scientific << std::setprecision(2) << "  lr " << lr << "  grad_norm "
                << grad_norm << std::endl;
    }
  }

  // A line of its own, above the progress bar.
  void message(const std::string& text) const { std::cout << (tty_ ? "\r\033[K" : "") << text << std::endl; }
  void finish() const {
    if (tty_) std::cout << "\n";
  }
  double steps_per_second(int64_t step) const {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    return static_cast<double>(step - first_) / std::max(seconds, 1e-9);
  }

 private:
  std::string bar(int64_t step) const {
    constexpr int64_t width = 24;
    const int64_t filled = width * step / total_;
    return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  }

  bool tty_;
  int64_t first_, total_;
  Clock::time_point start_;
  double smoothed_ = 0;
};

// The step and the seconds of a train.csv row "step,loss,lr,grad_norm,seconds".
std::pair<int64_t, double> parse_row(const std::string& path, int64_t line, const std::string& row) {
  int64_t step = 0;
  double seconds = 0;
  const char* end = row.data() + row.size();
  const auto [step_end, step_error] = std::from_chars(row.data(), end, step);
  const auto [seconds_end, seconds_error] = std::from_chars(row.data() + row.rfind(',') + 1, end, seconds);
  const bool ok = std::count(row.begin(), row.end(), ',') == 4 && step_error == std::errc() && *step_end == ',' &&
                  seconds_error == std::errc() && seconds_end == end;
  TG_CHECK(ok, "'", path, "' line ", line, " is not a row of step,loss,lr,grad_norm,seconds: '", row, "'");
  return {step, seconds};
}

// train.csv: step, loss, lr, grad_norm, seconds (wall time of the training
// steps since the first, carried on across resumes). A resumed run keeps the
// rows up to its checkpoint's step when they are steps 1 .. that step (rows
// of another run are dropped, with a note; rows past it are not read, a row
// cut short by a kill among them), writes them to a temporary file renamed
// over the old one, and appends after them. A failed write is an error.
class TrainCsv {
 public:
  TrainCsv(const std::string& path, int64_t resumed_step) : path_(path) {
    std::vector<std::string> kept;
    std::ifstream earlier(path);
    int64_t line = 0;
    bool in_order = true;
    for (std::string row; resumed_step > 0 && std::getline(earlier, row);) {
      if (++line == 1) continue;  // the header
      int64_t leading = 0;
      std::from_chars(row.data(), row.data() + row.size(), leading);
      if (leading > resumed_step) break;
      const auto [step, seconds] = parse_row(path, line, row);
      in_order = in_order && step == static_cast<int64_t>(kept.size()) + 1;
      kept.push_back(row);
      seconds_before_ = seconds;
    }
    if (!kept.empty() && (!in_order || static_cast<int64_t>(kept.size()) != resumed_step)) {
      std::cerr << "train_edit_diffusion: '" << path << "' does not hold steps 1-" << resumed_step
                << " of the run being resumed; its rows are dropped\n";
      kept.clear();
      seconds_before_ = 0;
    }
    const std::string staged = path + ".tmp";
    {
      std::ofstream out(staged, std::ios::trunc);
      out << "step,loss,lr,grad_norm,seconds\n";
      for (const std::string& row : kept) out << row << "\n";
      out.flush();
      TG_CHECK(out.good(), "cannot write '", staged, "'");
    }
    std::error_code renamed;
    fs::rename(staged, path, renamed);
    if (renamed) fs::remove(staged);
    TG_CHECK(!renamed, "cannot replace '", path, "': ", renamed.message());
    out_.open(path, std::ios::app);
    TG_CHECK(out_.is_open(), "cannot write '", path, "'");
  }

  void append(int64_t step, const toy::TrainStepResult& r, double lr, double train_seconds) {
    const double seconds = seconds_before_ + train_seconds;
    out_ << step << "," << std::setprecision(9) << r.loss << "," << std::setprecision(6) << lr << "," << r.grad_norm
         << "," << std::fixed << std::setprecision(3) << seconds << std::defaultfloat << "\n";
    out_.flush();
    TG_CHECK(out_.good(), "writing step ", step, " to '", path_, "' failed");
  }

 private:
  std::string path_;
  std::ofstream out_;
  double seconds_before_ = 0;
};

// The first kGridExamples held-out edits, sampled by the model, as a PNG grid.
void write_samples(const toy::EditDiT& model, const Options& o, const std::string& name, const Progress& progress) {
  const tg::TensorOptions opts{tg::DType::Float32, o.device};
  const toy::EditBatch batch = toy::make_edit_batch(kHeldOutSeed, 0, kGridExamples, opts);
  const tg::Tensor noise = toy::normal_noise({kGridExamples, toy::kTokens, toy::kPatchDim}, {kHeldOutNoiseSeed, 0}, opts);
  const tg::Tensor edited = toy::sample_edit(model, batch.source, batch.edit_mask, batch.colour, noise, o.sample_steps);
  const std::string path = (fs::path(o.out) / name).string();
  figures::write_sample_grid(path, batch.source, batch.edit_mask, batch.colour, edited, batch.target);
  progress.message("wrote " + path + " (rows: input | edit mask in the requested colour | model's edit | target)");
}

toy::HeldOutPsnr evaluate(const toy::EditDiT& model, const Options& o) {
  const toy::EditBatch heldout = toy::make_edit_batch(kHeldOutSeed, 0, o.heldout, {tg::DType::Float32, o.device});
  return toy::evaluate(model, heldout, kHeldOutNoiseSeed, o.sample_steps);
}

// loss.png from train.csv; a run whose plot fails still succeeds, saying so.
void plot(const Options& o) {
  const std::string png = (fs::path(o.out) / "loss.png").string();
  try {
    if (figures::plot_loss((fs::path(o.out) / "train.csv").string(), png)) {
      std::cout << "wrote " << png << "\n";
    } else {
      std::cout << "gnuplot not found: skipped " << png << " (apt-get install gnuplot-nox)\n";
    }
  } catch (const tg::Error& e) {
    std::cout << "no " << png << ": " << e.what() << "\n";
  }
}

std::string psnr_table(const toy::HeldOutPsnr& psnr, const Options& o) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "held-out PSNR inside the edit region (" << o.heldout
     << " edits, held-out seed " << kHeldOutSeed << ", " << o.sample_steps << " Euler steps):\n"
     << "  model                                   " << std::setw(6) << psnr.model << " dB\n"
     << "  baseline: copy the input                " << std::setw(6) << psnr.copy_input << " dB\n"
     << "  baseline: fill with the target's mean   " << std::setw(6) << psnr.mean_colour << " dB";
  return os.str();
}

// The options a resumed run must share with the run that wrote its
// checkpoint (where and how the attention runs may change).
nlohmann::ordered_json training_options(const Options& o) {
  return {{"steps", o.steps},   {"batch", o.batch},   {"lr", o.lr},
          {"warmup", o.warmup}, {"weight_decay", o.weight_decay}, {"max_grad_norm", o.max_grad_norm},
          {"seed", o.seed},     {"depth", o.depth},   {"mlp_ratio", o.mlp_ratio}};
}

// Refuses a checkpoint written with other training options, naming each.
void check_same_options(const Options& o) {
  const tg::safetensors::Metadata metadata = tg::safetensors::load_metadata(o.resume);
  const auto saved = metadata.find(kOptionsKey);
  TG_CHECK(saved != metadata.end(), "--resume '", o.resume, "' was not written by train_edit_diffusion (no '",
           kOptionsKey, "' metadata)");
  const nlohmann::json theirs = nlohmann::json::parse(saved->second, nullptr, false);
  const nlohmann::ordered_json options = training_options(o);
  std::string differences;
  for (const auto& [key, ours] : options.items()) {
    const auto it = theirs.is_object() ? theirs.find(key) : theirs.end();
    if (theirs.is_object() && it != theirs.end() && *it == ours) continue;
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    differences += " " + flag + " " + ours.dump() + " (checkpoint: " +
                   (theirs.is_object() && it != theirs.end() ? it->dump() : std::string("missing")) + ")";
  }
  TG_CHECK(differences.empty(), "--resume '", o.resume, "' was written with other options; this run has",
           differences);
}

// Creates --out, or says why it cannot.
void make_out_folder(const std::string& out) {
  std::error_code error;
  fs::create_directories(out, error);
  TG_CHECK(!error && fs::is_directory(out), "--out '", out, "' cannot be a folder: ",
           error ? error.message() : std::string("a file of that name exists"));
}

void write_metrics(const toy::HeldOutPsnr& psnr, const Options& o, double steps_per_second) {
  const nlohmann::ordered_json metrics = {
      {"steps", o.steps},
      {"batch", o.batch},
      {"seed", o.seed},
      {"heldout_seed", kHeldOutSeed},
      {"heldout_edits", o.heldout},
      {"sample_steps", o.sample_steps},
      {"steps_per_second", steps_per_second},
      {"psnr_db",
       {{"model", psnr.model}, {"copy_input", psnr.copy_input}, {"fill_with_target_region_mean", psnr.mean_colour}}}};
  const std::string path = (fs::path(o.out) / "metrics.json").string();
  std::ofstream file(path);
  file << metrics.dump(2) << "\n";
  TG_CHECK(file.good(), "cannot write '", path, "'");
}

int train(const Options& o) {
  TG_CHECK(o.device == tg::Device::CPU || tg::cuda::is_available(),
           "--device cuda, but this build or machine has no GPU");
  TG_CHECK(o.warmup <= o.steps, "--warmup ", o.warmup, " must be at most --steps ", o.steps);
  const tg::TensorOptions opts{tg::DType::Float32, o.device};
  tg::manual_seed(o.seed);
  toy::EditDiT model({.depth = o.depth, .mlp_ratio = o.mlp_ratio, .attention = o.attention}, opts);
  tg::optim::AdamW optimizer(model.parameters(), {o.lr, 0.9, 0.999, 1e-8, o.weight_decay});
  const tg::optim::CosineSchedule schedule(o.lr, o.warmup, o.steps, o.lr / 10);
  if (!o.resume.empty()) check_same_options(o);
  const int64_t start = o.resume.empty() ? 0 : tg::load_checkpoint(o.resume, model, optimizer);
  TG_CHECK(start < o.steps, "--resume '", o.resume, "' is at step ", start, ": that run is finished (--steps ", o.steps, ")");
  make_out_folder(o.out);
  const tg::safetensors::Metadata run_options{{kOptionsKey, training_options(o).dump()}};

  int64_t parameters = 0;
  for (const tg::Tensor& p : model.parameters()) parameters += p.numel();
  std::cout << "train_edit_diffusion: " << parameters << " parameters (" << o.depth
            << " DiT blocks, hidden 128, 2 heads of 64), "
            << (o.attention == tg::AttentionImpl::Fused ? "fused" : "decomposed") << " attention on "
            << (o.device == tg::Device::CUDA ? "cuda" : "cpu") << "\n  steps " << start + 1 << "-" << o.steps
            << " of " << o.batch << " edits, AdamW lr " << o.lr << " (warm-up " << o.warmup
            << ", cosine), seed " << o.seed << " -> " << o.out << "\n";

  TrainCsv csv((fs::path(o.out) / "train.csv").string(), start);
  Progress progress(start, o.steps);
  double train_seconds = 0;  // the training steps alone, without sampling, evaluation and saving
  for (int64_t step = start; step < o.steps; ++step) {
    optimizer.set_lr(schedule.lr(step));
    const auto t0 = Clock::now();
    const toy::EditBatch batch = toy::make_edit_batch(o.seed, step * o.batch, o.batch, opts);
    const toy::TrainStepResult r = toy::train_step(model, optimizer, batch, o.max_grad_norm);
    train_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    csv.append(step + 1, r, optimizer.lr(), train_seconds);
    progress.update(step + 1, r.loss, optimizer.lr(), r.grad_norm);
    const bool last = step + 1 == o.steps;
    if (every(o.sample_every, step + 1) && !last)
      write_samples(model, o, "samples_step" + std::to_string(step + 1) + ".png", progress);
    if (every(o.eval_every, step + 1) && !last)
      progress.message("step " + std::to_string(step + 1) + ": " + psnr_table(evaluate(model, o), o));
    if (every(o.checkpoint_every, step + 1) && !last) {
      const std::string name = "checkpoint_step" + std::to_string(step + 1) + ".safetensors";
      tg::save_checkpoint((fs::path(o.out) / name).string(), model, optimizer, step + 1, run_options);
    }
  }
  const double steps_per_second = static_cast<double>(o.steps - start) / std::max(train_seconds, 1e-9);
  progress.finish();
  std::cout << std::fixed << std::setprecision(2) << "trained " << o.steps - start << " steps at "
            << steps_per_second << " steps/s (training steps alone)\n" << std::defaultfloat;

  tg::save_checkpoint((fs::path(o.out) / "final.safetensors").string(), model, optimizer, o.steps, run_options);
  write_samples(model, o, "samples_final.png", progress);
  const toy::HeldOutPsnr psnr = evaluate(model, o);
  std::cout << psnr_table(psnr, o) << "\n";
  write_metrics(psnr, o, steps_per_second);
  plot(o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Trains the toy edit-diffusion model: recolour the shape inside the edit region."};
  add_options(app, options);
  CLI11_PARSE(app, argc, argv);
  if (app.count("--warmup") == 0) options.warmup = options.steps / 20;
  try {
    return train(options);
  } catch (const std::bad_alloc&) {
    std::cerr << "\ntrain_edit_diffusion: out of host memory (std::bad_alloc): try a smaller --batch or --heldout\n";
    return 1;
  } catch (const std::exception& e) {  // tg::Error, and what else the standard library throws
    std::cerr << "\ntrain_edit_diffusion: " << e.what() << "\n";
    return 1;
  }
}
