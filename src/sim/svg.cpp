// The SVG timeline: one row per device, stages coloured (forward light, backward dark), sends as
// thin bars under each row, a time axis and a legend.
#include <algorithm>
#include <cmath>
#include <map>

#include "sim/sim.h"

namespace gp::sim {

namespace {

std::string hsl_hex(double h, double s, double l) {
  // HSL -> RGB (h in degrees, s and l in [0,1]).
  double c = (1 - std::fabs(2 * l - 1)) * s;
  double hp = std::fmod(h, 360.0) / 60.0;
  double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (hp < 1) r = c, g = x;
  else if (hp < 2) r = x, g = c;
  else if (hp < 3) g = c, b = x;
  else if (hp < 4) g = x, b = c;
  else if (hp < 5) r = x, b = c;
  else r = c, b = x;
  double m = l - c / 2;
  auto ch = [&](double v) { return static_cast<int>(std::lround((v + m) * 255)); };
  return fmt::format("#{:02x}{:02x}{:02x}", ch(r), ch(g), ch(b));
}

double stage_hue(int stage) { return std::fmod(stage * 137.508 + 210, 360.0); }  // golden angle
std::string light(int stage) { return hsl_hex(stage_hue(stage), 0.65, 0.74); }
std::string dark(int stage) { return hsl_hex(stage_hue(stage), 0.65, 0.36); }

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

// A tick step of 1, 2 or 5 x 10^k giving about `target` ticks over `span`.
double nice_step(double span, int target) {
  double raw = span / target, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string time_label(double s, double step) {
  if (step >= 1) return fmt::format("{:g} s", s);
  if (step >= 1e-3) return fmt::format("{:g} ms", std::round(s * 1e6) / 1e3);
  return fmt::format("{:g} us", std::round(s * 1e9) / 1e3);
}

}  // namespace

std::string svg_timeline(const plan::Plan& p, const SimResult& r, const std::string& title) {
  std::vector<std::pair<int, int>> rows;  // (device, stage) in device order
  for (const plan::Stage& st : p.stages)
    for (int d : st.devices) rows.emplace_back(d, st.id);
  std::sort(rows.begin(), rows.end());
  std::map<int, int> row_of;
  for (size_t i = 0; i < rows.size(); ++i) row_of[rows[i].first] = static_cast<int>(i);

  const double left = 120, right = 30, plot_w = 1100, row_h = 26, send_h = 5, gap = 10;
  const double top = 58, pitch = row_h + send_h + 2 + gap;
  const double axis_y = top + rows.size() * pitch + 4;
  const double legend_y = axis_y + 40;
  const double width = left + plot_w + right;
  double T = r.iteration_time_s > 0 ? r.iteration_time_s : 1;
  auto X = [&](double t) { return left + t / T * plot_w; };

  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"@HEIGHT@\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width);
  std::string head = title.empty() ? std::string("Simulated iteration") : title;
  o += fmt::format(
      "<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n"
      "<text x=\"{}\" y=\"40\" font-size=\"12\" fill=\"#333\">iteration {:.4g} ms · {:.4g} "
      "samples/s · bubble {:.1f}% · {} stages on {} devices · mini-batch {}</text>\n",
      left, esc(head), left, r.iteration_time_s * 1e3, r.throughput_samples_per_s,
      r.bubble_fraction * 100, p.stages.size(), rows.size(), p.mini_batch_size);

  // Row backgrounds and labels.
  for (size_t i = 0; i < rows.size(); ++i) {
    double y = top + i * pitch;
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f3f3f3\"/>\n", left,
                     y, plot_w, row_h);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">device {} · s{}</text>\n", left - 8,
                     y + row_h / 2 + 4, rows[i].first, rows[i].second);
  }
  // Time axis.
  double step = nice_step(T, 10);
  for (double t = 0; t <= T * 1.0001; t += step) {
    double x = X(t);
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ccc\" "
                     "stroke-width=\"0.5\"/>\n",
                     x, top - 4, axis_y);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#333\">{}</text>\n", x,
                     axis_y + 14, time_label(t, step));
  }
  o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", left, axis_y,
                   left + plot_w, axis_y);

  using schedule::ActionKind;
  for (const Event& e : r.events) {
    auto it = row_of.find(e.device);
    if (it == row_of.end()) continue;
    double y = top + it->second * pitch;
    double x0 = X(e.start_s), w = std::max(0.0, X(e.end_s) - x0);
    std::string fill, label, text_fill = "#000";
    double h = row_h, yy = y;
    switch (e.kind) {
      case ActionKind::forward: fill = light(e.stage); label = std::to_string(e.micro_batch); break;
      case ActionKind::backward:
        fill = dark(e.stage);
        label = std::to_string(e.micro_batch);
        text_fill = "#fff";
        break;
      case ActionKind::allreduce: fill = "#d62728"; label = "AR"; text_fill = "#fff"; break;
      case ActionKind::optimizer_step: fill = "#444"; label = "opt"; text_fill = "#fff"; break;
      case ActionKind::send_act:
      case ActionKind::send_grad:
        fill = e.kind == ActionKind::send_act ? "#7f7f7f" : "#222";
        yy = y + row_h + 2;
        h = send_h;
        break;
      case ActionKind::recv_act:
      case ActionKind::recv_grad: continue;  // waiting shows as the empty row
    }
    if (w < 0.3 && h == send_h) w = 0.6;  // keep tiny transfers visible
    o += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" "
                     "stroke=\"{}\" stroke-width=\"0.4\"><title>{} [{:.6g}, {:.6g}] s</title></rect>\n",
                     x0, yy, w, h, fill, h == send_h ? fill : "#fff", esc(e.name), e.start_s,
                     e.end_s);
    if (!label.empty() && w >= 7.0 * label.size() + 2)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\" "
                       "fill=\"{}\">{}</text>\n",
                       x0 + w / 2, y + row_h / 2 + 4, text_fill, label);
  }

  // Legend: stages (forward light / backward dark), all-reduce, optimizer step, sends.
  double lx = left, ly = legend_y;
  auto swatch = [&](const std::string& fill, double sw, double sh) {
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", lx,
                     ly + (12 - sh) / 2, sw, sh, fill);
    lx += sw + 3;
  };
  auto text = [&](const std::string& t) {
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx, ly + 10, esc(t));
    lx += 7.0 * t.size() + 16;
    if (lx > left + plot_w - 150) lx = left, ly += 18;
  };
  for (const plan::Stage& st : p.stages) {
    swatch(light(st.id), 12, 12);
    swatch(dark(st.id), 12, 12);
    text(fmt::format("s{} F / B", st.id));
  }
  swatch("#d62728", 14, 12);
  text("all-reduce");
  swatch("#444", 14, 12);
  text("optimizer step");
  swatch("#7f7f7f", 18, send_h);
  text("send activations");
  swatch("#222", 18, send_h);
  text("send gradients");
  o += "</svg>\n";
  o.replace(o.find("@HEIGHT@"), 8, fmt::format("{:.0f}", ly + 30));
  return o;
}

}  // namespace gp::sim
