// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MachineParams: the GEMM curve's reading, the checks, and the JSON file format (nlohmann/json parses and writes it;
// the schema's checks, which name the file and the key, are here).
#include <mlacp/error.hpp>
#include <mlacp/model/machine.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mlacp::model {

const char* to_string(Dtype dtype) noexcept {
  switch (dtype) {
    case Dtype::float64:
      return "double";
    case Dtype::float32:
      return "float";
    case Dtype::bfloat16:
      return "bf16";
  }
  return "?";
}

Dtype parse_dtype(const std::string& name) {
  if (name == "double") return Dtype::float64;
  if (name == "float") return Dtype::float32;
  if (name == "bf16") return Dtype::bfloat16;
  throw InvalidArgument("dtype \"" + name + "\": expected \"double\", \"float\" or \"bf16\"");
}

int bytes_of(Dtype dtype) noexcept {
  switch (dtype) {
    case Dtype::float64:
      return 8;
    case Dtype::float32:
      return 4;
    case Dtype::bfloat16:
      return 2;
  }
  return 0;
}

namespace {

std::string short_number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

namespace {

/// The curve `points` (x increasing; `x_of` and `y_of` read a point) at `x`: log-linear between the points around it,
/// clamped at the ends. The GEMM curve and the attention rate by head width read their points this way.
template <class Point, class X, class Y>
double log_linear(const std::vector<Point>& points, double x, const X& x_of, const Y& y_of) {
  if (x <= x_of(points.front())) return y_of(points.front());
  if (x >= x_of(points.back())) return y_of(points.back());
  // The first point with x above; the one before it is at or below.
  const auto upper =
      std::upper_bound(points.begin(), points.end(), x, [&](double v, const Point& p) { return v < x_of(p); });
  const auto lower = upper - 1;
  if (x == x_of(*lower)) return y_of(*lower);
  const double t = (std::log(x) - std::log(x_of(*lower))) / (std::log(x_of(*upper)) - std::log(x_of(*lower)));
  return std::exp(std::log(y_of(*lower)) + t * (std::log(y_of(*upper)) - std::log(y_of(*lower))));
}

/// Whether `name` is a dtype the machine file knows; `unknown_dtype` follows a key that names one it does not.
bool known_dtype(const std::string& name) { return name == "double" || name == "float" || name == "bf16"; }
const char* const unknown_dtype = ": unknown dtype (expected \"double\", \"float\" or \"bf16\")";

}  // namespace

double MachineParams::gemm_rate(Dtype dtype, double m, double n, double k) const {
  const auto it = gemm.find(to_string(dtype));
  if (it == gemm.end() || it->second.empty()) {
    throw InvalidArgument(std::string("GEMM rate for dtype \"") + to_string(dtype) + "\": the machine \"" + name +
                          "\" has no GEMM curve for it (expected a \"gemm\" entry \"" + to_string(dtype) + "\")");
  }
  const auto& points = it->second;
  // 3 / (1/m + 1/n + 1/k), written so that a cube n x n x n gives n exactly.
  const double size = (m > 0 && n > 0 && k > 0) ? 3.0 * m * n * k / (n * k + m * k + m * n) : 0.0;
  return log_linear(
      points, size, [](const std::pair<double, double>& p) { return p.first; },
      [](const std::pair<double, double>& p) { return p.second; });
}

double MachineParams::gemm_time(Dtype dtype, double m, double n, double k) const {
  const double rate = gemm_rate(dtype, m, n, k);  // throws for a missing curve even for an empty product
  if (m <= 0 || n <= 0 || k <= 0) return 0.0;
  return 2.0 * m * n * k / rate;
}

double MachineParams::attention_forward_rate(Dtype dtype, double width) const {
  const auto it = attention_by_width.find(to_string(dtype));
  if (it == attention_by_width.end() || it->second.empty()) return attention_rate(dtype).forward_flops;
  return log_linear(
      it->second, width, [](const AttentionWidthRate& p) { return p.width; },
      [](const AttentionWidthRate& p) { return p.forward_flops; });
}
double MachineParams::attention_backward_rate(Dtype dtype, double width) const {
  const auto it = attention_by_width.find(to_string(dtype));
  if (it == attention_by_width.end() || it->second.empty()) return attention_rate(dtype).backward_flops;
  return log_linear(
      it->second, width, [](const AttentionWidthRate& p) { return p.width; },
      [](const AttentionWidthRate& p) { return p.backward_flops; });
}

double MachineParams::elementwise_rate(Dtype dtype) const {
  const auto it = elementwise_bandwidth.find(to_string(dtype));
  return it != elementwise_bandwidth.end() && it->second > 0 ? it->second : memory_bandwidth;
}

const AttentionRate& MachineParams::attention_rate(Dtype dtype) const {
  const auto it = attention.find(to_string(dtype));
  if (it == attention.end()) {
    throw InvalidArgument(std::string("attention rate for dtype \"") + to_string(dtype) + "\": the machine \"" + name +
                          "\" has none (expected an \"attention\" entry \"" + to_string(dtype) + "\")");
  }
  return it->second;
}

std::string MachineParams::error() const {
  std::vector<std::string> problems;
  const auto non_negative = [&](const std::string& key, double v) {
    if (!(v >= 0) || !std::isfinite(v)) problems.push_back(key + " = " + short_number(v) + " (expected >= 0)");
  };
  if (ranks_per_node < 1) {
    problems.push_back("ranks_per_node = " + std::to_string(ranks_per_node) + " (expected >= 1)");
  }
  non_negative("intra.alpha_s", intra.alpha_s);
  non_negative("intra.beta_s_per_byte", intra.beta_s_per_byte);
  non_negative("inter.alpha_s", inter.alpha_s);
  non_negative("inter.beta_s_per_byte", inter.beta_s_per_byte);
  non_negative("memory_bandwidth", memory_bandwidth);
  non_negative("memory_per_rank_bytes", memory_per_rank_bytes);
  non_negative("sync_s", sync_s);
  if (!(overlap_efficiency >= 0 && overlap_efficiency <= 1)) {
    problems.push_back("overlap_efficiency = " + short_number(overlap_efficiency) + " (expected 0 to 1)");
  }
  if (gemm.empty()) problems.push_back("gemm: no GEMM curve (expected one per dtype)");
  for (const auto& [dtype, points] : gemm) {
    const std::string key = "gemm." + dtype;
    if (!known_dtype(dtype)) problems.push_back(key + unknown_dtype);
    if (points.empty()) problems.push_back(key + ": no points (expected at least one [n, flops])");
    for (std::size_t i = 0; i < points.size(); ++i) {
      const auto& [n, rate] = points[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      if (!(n > 0) || !std::isfinite(n)) problems.push_back(at + ": n = " + short_number(n) + " (expected > 0)");
      if (!(rate > 0) || !std::isfinite(rate)) {
        problems.push_back(at + ": flops = " + short_number(rate) + " (expected > 0)");
      }
      if (i > 0 && !(n > points[i - 1].first)) {
        problems.push_back(at + ": n = " + short_number(n) + " (expected n increasing, after " +
                           short_number(points[i - 1].first) + ")");
      }
    }
    if (attention.find(dtype) == attention.end()) {
      problems.push_back("attention." + dtype + ": missing (gemm has \"" + dtype + "\")");
    }
  }
  for (const auto& [dtype, rate] : attention) {
    const std::string key = "attention." + dtype;
    if (gemm.find(dtype) == gemm.end()) problems.push_back("gemm." + dtype + ": missing (attention has it)");
    if (!(rate.forward_flops > 0) || !std::isfinite(rate.forward_flops)) {
      problems.push_back(key + ".forward_flops = " + short_number(rate.forward_flops) + " (expected > 0)");
    }
    if (!(rate.backward_flops > 0) || !std::isfinite(rate.backward_flops)) {
      problems.push_back(key + ".backward_flops = " + short_number(rate.backward_flops) + " (expected > 0)");
    }
  }
  for (const auto& [dtype, points] : attention_by_width) {
    const std::string key = "attention." + dtype + ".by_width";
    if (attention.find(dtype) == attention.end())
      problems.push_back(key + ": no attention." + dtype + " rate beside it");
    for (std::size_t i = 0; i < points.size(); ++i) {
      const auto& p = points[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      for (const double v : {p.width, p.forward_flops, p.backward_flops})
        if (!(v > 0) || !std::isfinite(v)) problems.push_back(at + ": " + short_number(v) + " (expected > 0)");
      if (i > 0 && !(p.width > points[i - 1].width))
        problems.push_back(at + ": width = " + short_number(p.width) + " (expected widths increasing, after " +
                           short_number(points[i - 1].width) + ")");
    }
  }
  for (const auto& [dtype, rate] : elementwise_bandwidth) {
    if (!known_dtype(dtype)) problems.push_back("elementwise_bandwidth." + dtype + unknown_dtype);
    non_negative("elementwise_bandwidth." + dtype, rate);
  }
  std::string out;
  for (const auto& p : problems) out += (out.empty() ? "" : "; ") + p;
  return out;
}

// ---- JSON ---------------------------------------------------------------------------------------------------------

namespace {

/// Keys kept in the order written: machine_to_json's order on output (name first), a file's own on input (so that
/// the first unknown key named is the file's first).
using Json = nlohmann::ordered_json;

/// `v` as JSON text; bytes that are not UTF-8 (a name set in code may hold any) become U+FFFD instead of throwing.
std::string json_text(const Json& v, int indent = -1) {
  return v.dump(indent, ' ', false, Json::error_handler_t::replace);
}

/// `key` as a JSON string, for a message.
std::string quoted(const std::string& key) { return json_text(Json(key)); }

/// The value as JSON text with a space after each separator, cut short for a message.
std::string shown(const Json& v) {
  std::string s;
  if (v.is_array()) {
    s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + shown(v[i]);
    s += "]";
  } else if (v.is_object()) {
    s = "{";
    bool first = true;
    for (const auto& item : v.items()) {
      s += (first ? "" : ", ") + quoted(item.key()) + ": " + shown(item.value());
      first = false;
    }
    s += "}";
  } else {
    s = json_text(v);
  }
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

/// `text` parsed. Beyond JSON's grammar it refuses a key twice in one object (JSON leaves open which value counts;
/// the parser would keep the last in silence) and nesting deeper than 64 (shown() recurses). A syntax error names the
/// line and the column.
Json parse(const std::string& text, const std::string& where) {
  // Where the parser is: per open object its keys so far and the current one, per open array the current index.
  struct Level {
    bool object = false;
    std::set<std::string> keys;
    std::string key;
    bool repeated = false;  // the current key came before in this object
    std::size_t index = 0;
  };
  std::vector<Level> levels;
  const auto path = [&] {
    std::string out;
    for (const Level& l : levels)
      out += l.object ? (out.empty() ? "" : ".") + l.key : "[" + std::to_string(l.index) + "]";
    return out;
  };
  // A value is complete (a scalar, or a container just closed): refused under a repeated key, counted in an array.
  const auto complete = [&](const Json& value) {
    if (levels.empty()) return;
    if (levels.back().repeated) {
      throw InvalidArgument(where + ": " + quoted(path()) + ": expected each key once, got it again with " +
                            shown(value));
    }
    if (!levels.back().object) ++levels.back().index;
  };
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= 64) throw InvalidArgument(where + ": " + quoted(path()) + ": expected nesting at most 64 deep");
        levels.emplace_back();
        levels.back().object = event == Json::parse_event_t::object_start;
        break;
      case Json::parse_event_t::key: {
        Level& level = levels.back();
        level.key = parsed.get<std::string>();
        level.repeated = !level.keys.insert(level.key).second;
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        levels.pop_back();
        complete(parsed);
        break;
      case Json::parse_event_t::value:
        complete(parsed);
        break;
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::exception& e) {
    // The parser's message without its id ("[json.exception.parse_error.101] "), which tells the file's author nothing.
    std::string what = e.what();
    const std::size_t id_end = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && id_end != std::string::npos) what.erase(0, id_end + 2);
    throw InvalidArgument(where + ": " + what + " (not valid JSON)");
  }
}

/// Reads the schema's values out of a parsed document, naming the file and the key path in every error.
class Schema {
 public:
  explicit Schema(const std::string& where) : where_(where) {}

  [[noreturn]] void fail(const std::string& key, const std::string& expected, const Json& got) const {
    throw InvalidArgument(where_ + ": " + quoted(key) + ": expected " + expected + ", got " + shown(got));
  }

  std::string string(const std::string& key, const Json& v) const {
    if (!v.is_string()) fail(key, "a string", v);
    return v.get<std::string>();
  }

  double number(const std::string& key, const Json& v, const char* expected, bool positive, double max = -1) const {
    if (!v.is_number()) fail(key, expected, v);
    const double d = v.get<double>();
    if (d < 0 || (positive && d == 0) || (max >= 0 && d > max)) fail(key, expected, v);
    return d;
  }

  double non_negative(const std::string& key, const Json& v) const {
    return number(key, v, "a non-negative number", false);
  }
  double positive(const std::string& key, const Json& v) const { return number(key, v, "a positive number", true); }

  int positive_int(const std::string& key, const Json& v) const {
    const char* expected = "a positive integer";
    const double d = number(key, v, expected, true);
    if (d != std::floor(d) || d > 1e9) fail(key, expected, v);
    return static_cast<int>(d);
  }

  const Json& object(const std::string& key, const Json& v, const std::string& expected) const {
    if (!v.is_object()) fail(key, expected, v);
    return v;
  }

  /// Throws naming the first key of `v` not in `known`.
  void only(const std::string& key, const Json& v, std::initializer_list<const char*> known) const {
    for (const auto& item : v.items()) {
      bool found = false;
      for (const char* k : known) found = found || item.key() == k;
      if (!found) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + quoted(k);
        const std::string path = key.empty() ? item.key() : key + "." + item.key();
        throw InvalidArgument(where_ + ": " + quoted(path) + ": unknown key (expected one of " + list + ")");
      }
    }
  }

  void dtype(const std::string& key, const std::string& name) const {
    if (!known_dtype(name)) throw InvalidArgument(where_ + ": " + quoted(key) + unknown_dtype);
  }

  LinkCost link(const std::string& key, const Json& v) const {
    object(key, v, "an object {\"alpha_s\", \"beta_s_per_byte\"}");
    only(key, v, {"alpha_s", "beta_s_per_byte"});
    LinkCost out;
    for (const auto& item : v.items()) {
      if (item.key() == "alpha_s") out.alpha_s = non_negative(key + ".alpha_s", item.value());
      if (item.key() == "beta_s_per_byte") out.beta_s_per_byte = non_negative(key + ".beta_s_per_byte", item.value());
    }
    return out;
  }

  std::vector<std::pair<double, double>> curve(const std::string& key, const Json& v) const {
    if (!v.is_array() || v.empty()) fail(key, "a non-empty array of [n, flops] pairs", v);
    std::vector<std::pair<double, double>> points;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const Json& p = v[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      const char* expected = "a pair [n, flops] of positive numbers";
      if (!p.is_array() || p.size() != 2) fail(at, expected, p);
      const double n = number(at, p[0], expected, true);
      const double rate = number(at, p[1], expected, true);
      if (!points.empty() && !(n > points.back().first)) {
        fail(at, "n increasing (after n = " + short_number(points.back().first) + ")", p);
      }
      points.emplace_back(n, rate);
    }
    return points;
  }

  AttentionRate attention(const std::string& key, const Json& v) const {
    object(key, v, "an object {\"forward_flops\", \"backward_flops\"[, \"by_width\"]}");
    only(key, v, {"forward_flops", "backward_flops", "by_width"});
    AttentionRate out;
    for (const auto& item : v.items()) {
      if (item.key() == "forward_flops") out.forward_flops = non_negative(key + ".forward_flops", item.value());
      if (item.key() == "backward_flops") out.backward_flops = non_negative(key + ".backward_flops", item.value());
    }
    return out;
  }
  /// The attention entry's optional "by_width" points ({} without).
  std::vector<AttentionWidthRate> attention_by_width(const std::string& key, const Json& v) const {
    std::vector<AttentionWidthRate> out;
    if (!v.contains("by_width")) return out;
    const Json& list = v["by_width"];
    const std::string at_list = key + ".by_width";
    if (!list.is_array()) fail(at_list, "an array of [width, forward_flops, backward_flops]", list);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Json& point = list[i];
      const std::string at = at_list + "[" + std::to_string(i) + "]";
      if (!point.is_array() || point.size() != 3) fail(at, "[width, forward_flops, backward_flops]", point);
      out.push_back({positive(at + "[0]", point[0]), positive(at + "[1]", point[1]), positive(at + "[2]", point[2])});
    }
    return out;
  }

 private:
  const std::string& where_;
};

}  // namespace

std::string machine_to_json(const MachineParams& m) {
  const auto link = [](const LinkCost& l) {
    return Json{{"alpha_s", l.alpha_s}, {"beta_s_per_byte", l.beta_s_per_byte}};
  };
  Json gemm = Json::object();
  for (const auto& [dtype, points] : m.gemm) {
    Json curve = Json::array();
    for (const auto& [n, rate] : points) curve.push_back(Json::array({n, rate}));
    gemm[dtype] = std::move(curve);
  }
  Json attention = Json::object();
  for (const auto& [dtype, rate] : m.attention) {
    Json entry = {{"forward_flops", rate.forward_flops}, {"backward_flops", rate.backward_flops}};
    const auto points = m.attention_by_width.find(dtype);
    if (points != m.attention_by_width.end() && !points->second.empty()) {
      Json by_width = Json::array();
      for (const auto& p : points->second)
        by_width.push_back(Json::array({p.width, p.forward_flops, p.backward_flops}));
      entry["by_width"] = std::move(by_width);
    }
    attention[dtype] = std::move(entry);
  }
  Json doc = {{"name", m.name},
              {"source", m.source},
              {"ranks_per_node", m.ranks_per_node},
              {"intra", link(m.intra)},
              {"inter", link(m.inter)},
              {"gemm", std::move(gemm)},
              {"attention", std::move(attention)},
              {"memory_bandwidth", m.memory_bandwidth}};
  if (!m.elementwise_bandwidth.empty()) doc["elementwise_bandwidth"] = m.elementwise_bandwidth;
  doc["memory_per_rank_bytes"] = m.memory_per_rank_bytes;
  doc["overlap_efficiency"] = m.overlap_efficiency;
  doc["sync_s"] = m.sync_s;
  return json_text(doc, 2) + "\n";
}

MachineParams machine_from_json(const std::string& text, const std::string& where) {
  const Json doc = parse(text, where);
  const Schema schema(where);
  if (!doc.is_object()) throw InvalidArgument(where + ": expected a JSON object at the top level, got " + shown(doc));
  schema.only("", doc,
              {"name", "source", "ranks_per_node", "intra", "inter", "gemm", "attention", "memory_bandwidth",
               "elementwise_bandwidth", "memory_per_rank_bytes", "overlap_efficiency", "sync_s"});
  MachineParams m;
  for (const auto& item : doc.items()) {
    const std::string& key = item.key();
    const Json& v = item.value();
    if (key == "name") {
      m.name = schema.string(key, v);
    } else if (key == "source") {
      m.source = schema.string(key, v);
    } else if (key == "ranks_per_node") {
      m.ranks_per_node = schema.positive_int(key, v);
    } else if (key == "intra" || key == "inter") {
      (key == "intra" ? m.intra : m.inter) = schema.link(key, v);
    } else if (key == "gemm") {
      schema.object(key, v, "an object: dtype -> [[n, flops], ...]");
      for (const auto& entry : v.items()) {
        schema.dtype(key + "." + entry.key(), entry.key());
        m.gemm[entry.key()] = schema.curve(key + "." + entry.key(), entry.value());
      }
    } else if (key == "attention") {
      schema.object(key, v, "an object: dtype -> {\"forward_flops\", \"backward_flops\"}");
      for (const auto& entry : v.items()) {
        const std::string at = key + "." + entry.key();
        schema.dtype(at, entry.key());
        m.attention[entry.key()] = schema.attention(at, entry.value());
        auto points = schema.attention_by_width(at, entry.value());
        if (!points.empty()) m.attention_by_width[entry.key()] = std::move(points);
      }
    } else if (key == "memory_bandwidth") {
      m.memory_bandwidth = schema.non_negative(key, v);
    } else if (key == "elementwise_bandwidth") {
      schema.object(key, v, "an object: dtype -> bytes per second");
      for (const auto& entry : v.items()) {
        schema.dtype(key + "." + entry.key(), entry.key());
        m.elementwise_bandwidth[entry.key()] = schema.non_negative(key + "." + entry.key(), entry.value());
      }
    } else if (key == "memory_per_rank_bytes") {
      m.memory_per_rank_bytes = schema.non_negative(key, v);
    } else if (key == "overlap_efficiency") {
      m.overlap_efficiency = schema.number(key, v, "a number from 0 to 1", false, 1.0);
    } else if (key == "sync_s") {
      m.sync_s = schema.non_negative(key, v);
    }
  }
  return m;
}

MachineParams read_machine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("machine parameters file \"" + path + "\": cannot be read (expected a JSON file)");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InvalidArgument("machine parameters file \"" + path + "\": reading failed");
  return machine_from_json(text.str(), path);
}

void write_machine(const MachineParams& m, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("machine parameters file \"" + path + "\": cannot be opened for writing");
  out << machine_to_json(m);
  out.flush();
  if (!out) throw Error("machine parameters file \"" + path + "\": writing failed");
}

}  // namespace mlacp::model
