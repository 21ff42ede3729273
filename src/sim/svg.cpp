// The SVG timeline: one row per device, stages coloured (forward light, backward dark; zero-bubble
// backward_input medium, backward_weight light and hatched), sends as thin bars under each row, a
// time axis and a legend.
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
// Zero-bubble passes: backward_input between the two; backward_weight light with a hatch.
std::string medium(int stage) { return hsl_hex(stage_hue(stage), 0.65, 0.55); }
constexpr const char* kHatch = "url(#w-hatch)";

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

// The picture's geometry: one row per device in device order, each row a compute lane with a
// thin send lane under it.
struct Layout {
  std::vector<std::pair<int, int>> rows;  // (device, stage) in device order
  std::map<int, int> row_of;              // device -> row
  double left = 120, right = 30, plot_w = 1100, row_h = 26, send_h = 5, gap = 10;
  double top = 58, pitch = row_h + send_h + 2 + gap;
  double axis_y = 0, legend_y = 0, width = 0, T = 1;
  double x(double t) const { return left + t / T * plot_w; }
};

Layout layout(const plan::Plan& p, const SimResult& r) {
  Layout L;
  for (const plan::Stage& st : p.stages)
    for (int d : st.devices) L.rows.emplace_back(d, st.id);
  std::sort(L.rows.begin(), L.rows.end());
  for (size_t i = 0; i < L.rows.size(); ++i) L.row_of[L.rows[i].first] = static_cast<int>(i);
  L.axis_y = L.top + L.rows.size() * L.pitch + 4;
  L.legend_y = L.axis_y + 40;
  L.width = L.left + L.plot_w + L.right;
  L.T = r.iteration_time_s > 0 ? r.iteration_time_s : 1;
  return L;
}

// The <svg> element (its height filled in at the end), the title and the summary line.
std::string svg_head(const Layout& L, const plan::Plan& p, const SimResult& r, const std::string& title) {
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"@HEIGHT@\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<defs><pattern id=\"w-hatch\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"2\" height=\"5\" fill=\"#000\" "
      "fill-opacity=\"0.35\"/></pattern></defs>\n",
      L.width);
  std::string head = title.empty() ? std::string("Simulated iteration") : title;
  o += fmt::format(
      "<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n"
      "<text x=\"{}\" y=\"40\" font-size=\"12\" fill=\"#333\">iteration {:.4g} ms · {:.4g} "
      "samples/s · bubble {:.1f}% · {} stages on {} devices · mini-batch {}</text>\n",
      L.left, esc(head), L.left, r.iteration_time_s * 1e3, r.throughput_samples_per_s, r.bubble_fraction * 100,
      p.stages.size(), L.rows.size(), p.mini_batch_size);
  return o;
}

// Row backgrounds and labels, then the time axis.
std::string svg_rows_and_axis(const Layout& L) {
  std::string o;
  for (size_t i = 0; i < L.rows.size(); ++i) {
    double y = L.top + i * L.pitch;
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f3f3f3\"/>\n", L.left, y, L.plot_w,
                     L.row_h);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">device {} · s{}</text>\n", L.left - 8,
                     y + L.row_h / 2 + 4, L.rows[i].first, L.rows[i].second);
  }
  double step = nice_step(L.T, 10);
  for (double t = 0; t <= L.T * 1.0001; t += step) {
    double x = L.x(t);
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ccc\" "
        "stroke-width=\"0.5\"/>\n",
        x, L.top - 4, L.axis_y);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#333\">{}</text>\n", x, L.axis_y + 14,
                     time_label(t, step));
  }
  o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", L.left, L.axis_y,
                   L.left + L.plot_w, L.axis_y);
  return o;
}

// The text inside an event's box: the micro-batch of a forward or backward, "AR", "opt".
std::string label_of(const Event& e) {
  using schedule::ActionKind;
  switch (e.kind) {
    case ActionKind::forward:
    case ActionKind::backward:
    case ActionKind::backward_input:
    case ActionKind::backward_weight: return std::to_string(e.micro_batch);
    case ActionKind::allreduce: return "AR";
    case ActionKind::optimizer_step: return "opt";
    default: return "";
  }
}

// One event's box (with a hover title) and its label where it fits; receives draw nothing
// (waiting shows as the empty row).
std::string svg_event(const Layout& L, const Event& e) {
  using schedule::ActionKind;
  auto it = L.row_of.find(e.device);
  if (it == L.row_of.end()) return "";
  double y = L.top + it->second * L.pitch;
  double x0 = L.x(e.start_s), w = std::max(0.0, L.x(e.end_s) - x0);
  const std::string label = label_of(e);
  std::string fill, text_fill = "#000";
  double h = L.row_h, yy = y;
  switch (e.kind) {
    case ActionKind::forward: fill = light(e.stage); break;
    case ActionKind::backward:
      fill = dark(e.stage);
      text_fill = "#fff";
      break;
    case ActionKind::backward_input:
      fill = medium(e.stage);
      text_fill = "#fff";
      break;
    case ActionKind::backward_weight: fill = light(e.stage); break;
    case ActionKind::allreduce:
      fill = "#d62728";
      text_fill = "#fff";
      break;
    case ActionKind::optimizer_step:
      fill = "#444";
      text_fill = "#fff";
      break;
    case ActionKind::send_act:
    case ActionKind::send_grad:
      fill = e.kind == ActionKind::send_act ? "#7f7f7f" : "#222";
      yy = y + L.row_h + 2;
      h = L.send_h;
      break;
    case ActionKind::recv_act:
    case ActionKind::recv_grad: return "";
  }
  if (w < 0.3 && h == L.send_h) w = 0.6;  // keep tiny transfers visible
  std::string o = fmt::format(
      "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" "
      "stroke=\"{}\" stroke-width=\"0.4\"><title>{} [{:.6g}, {:.6g}] s</title></rect>\n",
      x0, yy, w, h, fill, h == L.send_h ? fill : "#fff", esc(e.name), e.start_s, e.end_s);
  if (e.kind == ActionKind::backward_weight)
    o += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"/>\n", x0, yy, w, h,
                     kHatch);
  if (!label.empty() && w >= 7.0 * label.size() + 2)
    o += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\" "
        "fill=\"{}\">{}</text>\n",
        x0 + w / 2, y + L.row_h / 2 + 4, text_fill, label);
  return o;
}

// Legend: stages (the passes the timeline has: F light, B dark, BI medium, W hatched), all-reduce,
// optimizer step, sends. Returns the y the picture ends at.
double svg_legend(const Layout& L, const plan::Plan& p, const SimResult& r, std::string& o) {
  using schedule::ActionKind;
  double lx = L.left, ly = L.legend_y;
  auto swatch = [&](const std::string& fill, double sw, double sh, bool hatch = false) {
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", lx,
                     ly + (12 - sh) / 2, sw, sh, fill);
    if (hatch)
      o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", lx,
                       ly + (12 - sh) / 2, sw, sh, kHatch);
    lx += sw + 3;
  };
  bool has_b = false, has_split = false;
  for (const Event& e : r.events) {
    has_b = has_b || e.kind == ActionKind::backward;
    has_split = has_split || e.kind == ActionKind::backward_input || e.kind == ActionKind::backward_weight;
  }
  if (!has_b && !has_split) has_b = true;  // no events recorded: the classic legend
  auto text = [&](const std::string& t) {
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx, ly + 10, esc(t));
    lx += 7.0 * t.size() + 16;
    if (lx > L.left + L.plot_w - 150) lx = L.left, ly += 18;
  };
  for (const plan::Stage& st : p.stages) {
    std::string names = "F";
    swatch(light(st.id), 12, 12);
    if (has_b) {
      swatch(dark(st.id), 12, 12);
      names += " / B";
    }
    if (has_split) {
      swatch(medium(st.id), 12, 12);
      swatch(light(st.id), 12, 12, true);
      names += " / BI / W";
    }
    text(fmt::format("s{} {}", st.id, names));
  }
  swatch("#d62728", 14, 12);
  text("all-reduce");
  swatch("#444", 14, 12);
  text("optimizer step");
  swatch("#7f7f7f", 18, L.send_h);
  text("send activations");
  swatch("#222", 18, L.send_h);
  text("send gradients");
  return ly + 30;
}

}  // namespace

std::string svg_timeline(const plan::Plan& p, const SimResult& r, const std::string& title) {
  const Layout L = layout(p, r);
  std::string o = svg_head(L, p, r, title) + svg_rows_and_axis(L);
  for (const Event& e : r.events) o += svg_event(L, e);
  const double height = svg_legend(L, p, r, o);
  o += "</svg>\n";
  o.replace(o.find("@HEIGHT@"), 8, fmt::format("{:.0f}", height));
  return o;
}

}  // namespace gp::sim
