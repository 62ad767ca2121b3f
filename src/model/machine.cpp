// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MachineParams: the GEMM curve's reading, the checks, and the JSON file format (a small reader and writer for this
// one schema, so that the planner needs no JSON dependency).
#include <mlacp/error.hpp>
#include <mlacp/model/machine.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
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

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

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

/// A parsed JSON value; objects keep their keys in order.
struct Json {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  double number = 0;
  std::string text;  ///< the string, or the number as written
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

/// The value as JSON text, cut short for a message.
std::string shown(const Json& v) {
  std::string s;
  switch (v.type) {
    case Json::Type::null:
      s = "null";
      break;
    case Json::Type::boolean:
      s = v.boolean ? "true" : "false";
      break;
    case Json::Type::number:
      s = v.text;
      break;
    case Json::Type::string:
      s = json_quoted(v.text);
      break;
    case Json::Type::array:
      s = "[";
      for (std::size_t i = 0; i < v.items.size(); ++i) s += (i ? ", " : "") + shown(v.items[i]);
      s += "]";
      break;
    case Json::Type::object:
      s = "{";
      for (std::size_t i = 0; i < v.members.size(); ++i) {
        s += (i ? ", " : "") + json_quoted(v.members[i].first) + ": " + shown(v.members[i].second);
      }
      s += "}";
      break;
  }
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

class Reader {
 public:
  Reader(const std::string& text, const std::string& where) : text_(text), where_(where) {}

  Json document() {
    skip_space();
    Json v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("expected the end of the text after the top-level value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string got = pos_ < text_.size() ? "\"" + text_.substr(pos_, 12) + "\"" : "the end of the text";
    const auto nl = got.find('\n');
    if (nl != std::string::npos) got = got.substr(0, nl) + "\"";
    throw InvalidArgument(where_ + ": line " + std::to_string(line) + ", column " + std::to_string(column) + ": " +
                          what + ", got " + got + " (not valid JSON)");
  }

  /// Steps over `c` when it is next; false (nothing consumed) otherwise.
  bool consume(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool literal(const char* word) {
    const std::string w(word);
    if (text_.compare(pos_, w.size(), w) == 0) {
      pos_ += w.size();
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64) fail("expected nesting at most 64 deep");
    if (pos_ >= text_.size()) fail("expected a value");
    Json v;
    const char c = text_[pos_];
    if (c == '{') {
      v.type = Json::Type::object;
      ++pos_;
      skip_space();
      if (consume('}')) return v;
      for (;;) {
        skip_space();
        if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a key in double quotes");
        const std::size_t key_at = pos_;
        std::string key = string();
        for (const auto& m : v.members) {
          if (m.first == key) {
            pos_ = key_at;
            fail("expected each key once, but " + json_quoted(key) + " repeats");
          }
        }
        skip_space();
        if (!consume(':')) fail("expected ':' after the key " + json_quoted(key));
        skip_space();
        Json member = value(depth + 1);
        v.members.emplace_back(std::move(key), std::move(member));
        skip_space();
        if (consume(',')) continue;
        if (consume('}')) return v;
        fail("expected ',' or '}' in an object");
      }
    }
    if (c == '[') {
      v.type = Json::Type::array;
      ++pos_;
      skip_space();
      if (consume(']')) return v;
      for (;;) {
        skip_space();
        v.items.push_back(value(depth + 1));
        skip_space();
        if (consume(',')) continue;
        if (consume(']')) return v;
        fail("expected ',' or ']' in an array");
      }
    }
    if (c == '"') {
      v.type = Json::Type::string;
      v.text = string();
      return v;
    }
    if (literal("true")) {
      v.type = Json::Type::boolean;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.type = Json::Type::boolean;
      return v;
    }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail("expected a value (an object, array, string, number, true, false or null)");
  }

  Json number() {
    const std::size_t start = pos_;
    const auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > from;
    };
    if (text_[pos_] == '-') ++pos_;
    if (!digits()) fail("expected digits in a number");
    if (consume('.')) {
      if (!digits()) fail("expected digits after the decimal point");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) fail("expected digits in the exponent");
    }
    Json v;
    v.type = Json::Type::number;
    v.text = text_.substr(start, pos_ - start);
    v.number = std::strtod(v.text.c_str(), nullptr);
    if (!std::isfinite(v.number)) {
      pos_ = start;
      fail("expected a number within double's range");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("expected four hex digits after \\u");
    unsigned cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') {
        cp |= static_cast<unsigned>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        cp |= static_cast<unsigned>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        cp |= static_cast<unsigned>(h - 'A' + 10);
      } else {
        --pos_;
        fail("expected four hex digits after \\u");
      }
    }
    return cp;
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("expected the closing '\"' of a string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("expected no raw control character in a string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) fail("expected an escape after '\\'");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && text_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            const unsigned low = hex4();
            if (low >= 0xDC00 && low < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              append_utf8(out, cp);
              cp = low;
            }
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("expected one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u after '\\'");
      }
    }
  }

  const std::string& text_;
  const std::string& where_;
  std::size_t pos_ = 0;
};

/// Reads the schema's values out of a parsed document, naming the file and the key path in every error.
class Schema {
 public:
  explicit Schema(const std::string& where) : where_(where) {}

  [[noreturn]] void fail(const std::string& key, const std::string& expected, const Json& got) const {
    throw InvalidArgument(where_ + ": " + json_quoted(key) + ": expected " + expected + ", got " + shown(got));
  }

  std::string string(const std::string& key, const Json& v) const {
    if (v.type != Json::Type::string) fail(key, "a string", v);
    return v.text;
  }

  double number(const std::string& key, const Json& v, const char* expected, bool positive, double max = -1) const {
    if (v.type != Json::Type::number) fail(key, expected, v);
    if (v.number < 0 || (positive && v.number == 0) || (max >= 0 && v.number > max)) fail(key, expected, v);
    return v.number;
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
    if (v.type != Json::Type::object) fail(key, expected, v);
    return v;
  }

  /// Throws naming the first key of `v` not in `known`.
  void only(const std::string& key, const Json& v, std::initializer_list<const char*> known) const {
    for (const auto& [name, member] : v.members) {
      bool found = false;
      for (const char* k : known) found = found || name == k;
      if (!found) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + json_quoted(k);
        const std::string path = key.empty() ? name : key + "." + name;
        throw InvalidArgument(where_ + ": " + json_quoted(path) + ": unknown key (expected one of " + list + ")");
      }
    }
  }

  void dtype(const std::string& key, const std::string& name) const {
    if (!known_dtype(name)) throw InvalidArgument(where_ + ": " + json_quoted(key) + unknown_dtype);
  }

  LinkCost link(const std::string& key, const Json& v) const {
    object(key, v, "an object {\"alpha_s\", \"beta_s_per_byte\"}");
    only(key, v, {"alpha_s", "beta_s_per_byte"});
    LinkCost out;
    for (const auto& [name, member] : v.members) {
      if (name == "alpha_s") out.alpha_s = non_negative(key + ".alpha_s", member);
      if (name == "beta_s_per_byte") out.beta_s_per_byte = non_negative(key + ".beta_s_per_byte", member);
    }
    return out;
  }

  std::vector<std::pair<double, double>> curve(const std::string& key, const Json& v) const {
    if (v.type != Json::Type::array || v.items.empty()) {
      fail(key, "a non-empty array of [n, flops] pairs", v);
    }
    std::vector<std::pair<double, double>> points;
    for (std::size_t i = 0; i < v.items.size(); ++i) {
      const Json& p = v.items[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      const char* expected = "a pair [n, flops] of positive numbers";
      if (p.type != Json::Type::array || p.items.size() != 2) fail(at, expected, p);
      const double n = number(at, p.items[0], expected, true);
      const double rate = number(at, p.items[1], expected, true);
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
    for (const auto& [name, member] : v.members) {
      if (name == "forward_flops") out.forward_flops = non_negative(key + ".forward_flops", member);
      if (name == "backward_flops") out.backward_flops = non_negative(key + ".backward_flops", member);
    }
    return out;
  }
  /// The attention entry's optional "by_width" points ({} without).
  std::vector<AttentionWidthRate> attention_by_width(const std::string& key, const Json& v) const {
    std::vector<AttentionWidthRate> out;
    for (const auto& [name, member] : v.members) {
      if (name == "by_width") {
        const std::string list = key + ".by_width";
        if (member.type != Json::Type::array)
          throw InvalidArgument(where_ + ": " + json_quoted(list) +
                                ": expected an array of [width, forward_flops, backward_flops], got " + shown(member));
        for (std::size_t i = 0; i < member.items.size(); ++i) {
          const Json& point = member.items[i];
          const std::string at = list + "[" + std::to_string(i) + "]";
          if (point.type != Json::Type::array || point.items.size() != 3)
            throw InvalidArgument(where_ + ": " + json_quoted(at) +
                                  ": expected [width, forward_flops, backward_flops], got " + shown(point));
          out.push_back({positive(at + "[0]", point.items[0]), positive(at + "[1]", point.items[1]),
                         positive(at + "[2]", point.items[2])});
        }
      }
    }
    return out;
  }

 private:
  const std::string& where_;
};

}  // namespace

std::string json_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string machine_to_json(const MachineParams& m) {
  std::ostringstream out;
  const auto link = [&](const LinkCost& l) {
    return "{\"alpha_s\": " + number_text(l.alpha_s) + ", \"beta_s_per_byte\": " + number_text(l.beta_s_per_byte) + "}";
  };
  out << "{\n";
  out << "  \"name\": " << json_quoted(m.name) << ",\n";
  out << "  \"source\": " << json_quoted(m.source) << ",\n";
  out << "  \"ranks_per_node\": " << m.ranks_per_node << ",\n";
  out << "  \"intra\": " << link(m.intra) << ",\n";
  out << "  \"inter\": " << link(m.inter) << ",\n";
  out << "  \"gemm\": {";
  bool first = true;
  for (const auto& [dtype, points] : m.gemm) {
    out << (first ? "\n" : ",\n") << "    " << json_quoted(dtype) << ": [";
    for (std::size_t i = 0; i < points.size(); ++i) {
      out << (i ? ", " : "") << "[" << number_text(points[i].first) << ", " << number_text(points[i].second) << "]";
    }
    out << "]";
    first = false;
  }
  out << (first ? "},\n" : "\n  },\n");
  out << "  \"attention\": {";
  first = true;
  for (const auto& [dtype, rate] : m.attention) {
    out << (first ? "\n" : ",\n") << "    " << json_quoted(dtype)
        << ": {\"forward_flops\": " << number_text(rate.forward_flops)
        << ", \"backward_flops\": " << number_text(rate.backward_flops);
    const auto points = m.attention_by_width.find(dtype);
    if (points != m.attention_by_width.end() && !points->second.empty()) {
      out << ", \"by_width\": [";
      for (std::size_t i = 0; i < points->second.size(); ++i) {
        const auto& p = points->second[i];
        out << (i ? ", " : "") << "[" << number_text(p.width) << ", " << number_text(p.forward_flops) << ", "
            << number_text(p.backward_flops) << "]";
      }
      out << "]";
    }
    out << "}";
    first = false;
  }
  out << (first ? "},\n" : "\n  },\n");
  out << "  \"memory_bandwidth\": " << number_text(m.memory_bandwidth) << ",\n";
  if (!m.elementwise_bandwidth.empty()) {
    out << "  \"elementwise_bandwidth\": {";
    first = true;
    for (const auto& [dtype, rate] : m.elementwise_bandwidth) {
      out << (first ? "" : ", ") << json_quoted(dtype) << ": " << number_text(rate);
      first = false;
    }
    out << "},\n";
  }
  out << "  \"memory_per_rank_bytes\": " << number_text(m.memory_per_rank_bytes) << ",\n";
  out << "  \"overlap_efficiency\": " << number_text(m.overlap_efficiency) << ",\n";
  out << "  \"sync_s\": " << number_text(m.sync_s) << "\n";
  out << "}\n";
  return out.str();
}

MachineParams machine_from_json(const std::string& text, const std::string& where) {
  const Json doc = Reader(text, where).document();
  const Schema schema(where);
  if (doc.type != Json::Type::object) {
    throw InvalidArgument(where + ": expected a JSON object at the top level, got " + shown(doc));
  }
  schema.only("", doc,
              {"name", "source", "ranks_per_node", "intra", "inter", "gemm", "attention", "memory_bandwidth",
               "elementwise_bandwidth", "memory_per_rank_bytes", "overlap_efficiency", "sync_s"});
  MachineParams m;
  for (const auto& [key, v] : doc.members) {
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
      for (const auto& [dtype, points] : v.members) {
        schema.dtype(key + "." + dtype, dtype);
        m.gemm[dtype] = schema.curve(key + "." + dtype, points);
      }
    } else if (key == "attention") {
      schema.object(key, v, "an object: dtype -> {\"forward_flops\", \"backward_flops\"}");
      for (const auto& [dtype, rate] : v.members) {
        schema.dtype(key + "." + dtype, dtype);
        m.attention[dtype] = schema.attention(key + "." + dtype, rate);
        auto points = schema.attention_by_width(key + "." + dtype, rate);
        if (!points.empty()) m.attention_by_width[dtype] = std::move(points);
      }
    } else if (key == "memory_bandwidth") {
      m.memory_bandwidth = schema.non_negative(key, v);
    } else if (key == "elementwise_bandwidth") {
      schema.object(key, v, "an object: dtype -> bytes per second");
      for (const auto& [dtype, rate] : v.members) {
        schema.dtype(key + "." + dtype, dtype);
        m.elementwise_bandwidth[dtype] = schema.non_negative(key + "." + dtype, rate);
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
