#include "train/report.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

struct TrainRow {
  double step = 0, loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
};
struct LoadCell {
  double step = 0, layer = 0, max_over_mean = 0, hot_cold = 0;
};

struct Metrics {
  std::vector<TrainRow> train;
  std::map<std::string, std::vector<std::pair<double, double>>> eval;  // corpus -> (step, loss)
  std::vector<LoadCell> load;
};

double num(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

Metrics read_metrics(const fs::path& file) {
  std::ifstream in(file);
  MT_CHECK(in.good(), IoError, "report: cannot read ", file.string());
  Metrics m;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      MT_THROW(ValueError, "report: ", file.string(), ":", n, ": not a JSON object (", e.what(),
               ")");
    }
    MT_CHECK(j.is_object() && j.contains("step") && j["step"].is_number(), ValueError,
             "report: ", file.string(), ":", n, ": expected an object with a numeric \"step\"");
    const double step = j["step"].get<double>();
    if (j.contains("loss") && j["loss"].is_number()) {
      m.train.push_back(
          {step, num(j, "loss"), num(j, "lr"), num(j, "grad_norm"), num(j, "tokens_per_s")});
      if (j.contains("expert_load") && j["expert_load"].is_array())
        for (const auto& l : j["expert_load"])
          m.load.push_back({step, num(l, "layer"), num(l, "max_over_mean"), num(l, "hot_cold")});
    }
    if (j.contains("eval") && j["eval"].is_object())
      for (const auto& [corpus, e] : j["eval"].items())
        if (e.is_object() && e.contains("loss") && e["loss"].is_number())
          m.eval[corpus].push_back({step, e["loss"].get<double>()});
  }
  MT_CHECK(!m.train.empty() || !m.eval.empty(), ValueError, "report: ", file.string(),
           " holds no training or eval metrics");
  return m;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  MT_CHECK(out.good(), IoError, "report: cannot write ", p.string());
}

std::string quoted(const fs::path& p) {
  const std::string s = p.string();
  MT_CHECK(s.find('\'') == std::string::npos, ValueError, "report: path ", s,
           " contains a single quote");
  return "'" + s + "'";
}

}  // namespace

std::vector<std::string> render_report(const std::string& run_dir, const std::string& gnuplot) {
  const fs::path dir(run_dir);
  MT_CHECK(fs::is_directory(dir), IoError, "report: run directory ", run_dir, " does not exist");
  const fs::path file = dir / "metrics.jsonl";
  MT_CHECK(fs::is_regular_file(file), IoError, "report: ", run_dir,
           " has no metrics.jsonl (is it a run directory written by `moetrain train`?)");
  const Metrics m = read_metrics(file);

  const fs::path plots = dir / "plots";
  const fs::path tmp = plots / ".tmp-report";
  fs::create_directories(tmp);
  std::ostringstream train;
  for (const TrainRow& r : m.train)
    train << r.step << " " << r.loss << " " << r.lr << " " << r.grad_norm << " " << r.tokens_per_s
          << "\n";
  write_file(tmp / "train.dat", train.str());

  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,540 font 'sans,10'\nset grid\nset key outside right\n"
     << "set xlabel 'step'\n";
  std::vector<std::string> names;
  // Loss: training loss and every eval corpus.
  {
    gp << "set output " << quoted(tmp / "loss.png") << "\nset title 'loss'\nset ylabel 'loss'\n";
    std::string sep = "plot ";
    if (!m.train.empty()) {
      gp << sep << quoted(tmp / "train.dat") << " using 1:2 with lines lw 2 title 'train'";
      sep = ", ";
    }
    int i = 0;
    for (const auto& [corpus, pts] : m.eval) {
      std::ostringstream d;
      for (const auto& [s, l] : pts) d << s << " " << l << "\n";
      const fs::path f = tmp / ("eval" + std::to_string(i++) + ".dat");
      write_file(f, d.str());
      std::string title = corpus;
      for (char& ch : title)
        if (ch == '\'' || ch == '_') ch = ' ';
      gp << sep << quoted(f) << " using 1:2 with linespoints pt 7 title 'eval " << title << "'";
      sep = ", ";
    }
    gp << "\n";
    names.push_back("loss.png");
  }
  if (!m.train.empty()) {
    gp << "set output " << quoted(tmp / "throughput.png")
       << "\nset title 'throughput'\nset ylabel 'tokens/s'\nset yrange [0:*]\nplot "
       << quoted(tmp / "train.dat") << " using 1:5 with lines lw 2 title 'tokens/s'\n"
       << "set yrange [*:*]\n";
    gp << "set output " << quoted(tmp / "optim.png")
       << "\nset title 'learning rate and gradient norm'\nset ylabel 'learning rate'\n"
       << "set y2label 'gradient norm'\nset ytics nomirror\nset y2tics\nplot "
       << quoted(tmp / "train.dat") << " using 1:3 with lines lw 2 title 'lr', "
       << quoted(tmp / "train.dat") << " using 1:4 axes x1y2 with lines title 'grad norm'\n"
       << "unset y2label\nunset y2tics\nset ytics mirror\n";
    names.push_back("throughput.png");
    names.push_back("optim.png");
  }
  if (!m.load.empty()) {
    // One cell per (logged step, MoE layer), spanning to the next logged step: steps need not be
    // evenly spaced (the last one rarely is).
    std::vector<double> steps;
    for (const LoadCell& c : m.load)
      if (steps.empty() || steps.back() != c.step) steps.push_back(c.step);
    std::map<double, double> half;
    for (size_t i = 0; i < steps.size(); ++i) {
      const double w = steps.size() == 1      ? 0.5
                       : i + 1 < steps.size() ? (steps[i + 1] - steps[i]) / 2
                                              : (steps[i] - steps[i - 1]) / 2;
      half[steps[i]] = w;
    }
    std::ostringstream d;
    for (const LoadCell& c : m.load)
      d << c.step << " " << c.layer << " " << c.step - half[c.step] << " " << c.step + half[c.step]
        << " " << c.layer - 0.5 << " " << c.layer + 0.5 << " " << c.max_over_mean << " "
        << c.hot_cold << "\n";
    write_file(tmp / "load.dat", d.str());
    gp << "set output " << quoted(tmp / "expert_load.png") << "\nset size 1,1\nunset key\n"
       << "set terminal pngcairo size 900,800 font 'sans,10'\n"
       << "set palette defined (0 '#ffffcc', 0.5 '#fd8d3c', 1 '#800026')\n"
       << "set multiplot layout 2,1 title 'expert load per MoE layer'\nset ylabel 'layer'\n"
       << "set ytics 1\nset title 'max / mean tokens per expert (1 = balanced)'\nplot "
       << quoted(tmp / "load.dat")
       << " using 1:2:3:4:5:6:7 with boxxyerror fs solid 1.0 noborder lc palette\n"
       << "set title 'hottest / coldest expert'\nplot " << quoted(tmp / "load.dat")
       << " using 1:2:3:4:5:6:8 with boxxyerror fs solid 1.0 noborder lc palette\n"
       << "unset multiplot\n";
    names.push_back("expert_load.png");
  }
  write_file(tmp / "report.gp", gp.str());

  const fs::path log = tmp / "gnuplot.log";
  const std::string cmd = gnuplot + " " + quoted(tmp / "report.gp") + " > " + quoted(log) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream lf(log);
    std::string out((std::istreambuf_iterator<char>(lf)), std::istreambuf_iterator<char>());
    MT_THROW(IoError, "report: '", gnuplot, "' failed (exit status ", rc, "); ",
             out.find("not found") != std::string::npos ? "install gnuplot-nox (tools/setup.sh)"
                                                        : "its output: " + out);
  }
  std::vector<std::string> written;
  for (const std::string& n : names) {
    MT_CHECK(fs::is_regular_file(tmp / n) && fs::file_size(tmp / n) > 0, IoError,
             "report: ", gnuplot, " did not write ", n);
    fs::rename(tmp / n, plots / n);
    written.push_back((plots / n).string());
  }
  fs::remove_all(tmp);
  return written;
}

}  // namespace mt
