// A strict JSON reader for tests that check files strata writes (traces): the whole text must
// be one JSON value (RFC 8259 grammar: objects, arrays, strings with escapes, numbers, true,
// false, null); anything else throws std::runtime_error naming the offset.
#pragma once

#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata_test {

struct json {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  bool flag = false;
  double number = 0;
  std::string text;
  std::vector<json> items;
  /// An object's members in file order: names and values side by side (a vector of
  /// std::pair<std::string, json> inside json itself needs the pair of an incomplete type,
  /// which clang refuses).
  std::vector<std::string> member_names;
  std::vector<json> member_values;

  /// The member `name` of an object, or nullptr.
  [[nodiscard]] const json* find(std::string_view name) const {
    for (std::size_t i = 0; i < member_names.size(); ++i)
      if (member_names[i] == name) return &member_values[i];
    return nullptr;
  }

  static json parse(std::string_view text) {
    std::size_t at = 0;
    json value = parse_value(text, at);
    skip_space(text, at);
    if (at != text.size()) fail(at, "text after the value");
    return value;
  }

 private:
  [[noreturn]] static void fail(std::size_t at, const std::string& what) {
    throw std::runtime_error("json: " + what + " at offset " + std::to_string(at));
  }
  static void skip_space(std::string_view s, std::size_t& at) {
    while (at < s.size() && (s[at] == ' ' || s[at] == '\n' || s[at] == '\r' || s[at] == '\t'))
      ++at;
  }
  static void expect(std::string_view s, std::size_t& at, std::string_view word) {
    if (s.substr(at, word.size()) != word) fail(at, "expected " + std::string(word));
    at += word.size();
  }
  static std::string parse_string(std::string_view s, std::size_t& at) {
    expect(s, at, "\"");
    std::string out;
    while (true) {
      if (at >= s.size()) fail(at, "unterminated string");
      const char c = s[at++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail(at - 1, "control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at >= s.size()) fail(at, "unterminated escape");
      const char e = s[at++];
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
          if (at + 4 > s.size()) fail(at, "short \\u escape");
          for (std::size_t i = 0; i < 4; ++i)
            if (!std::isxdigit(static_cast<unsigned char>(s[at + i]))) fail(at, "bad \\u escape");
          const long code = std::strtol(std::string(s.substr(at, 4)).c_str(), nullptr, 16);
          at += 4;
          out += code < 0x80 ? static_cast<char>(code) : '?';
          break;
        }
        default:
          fail(at - 1, "bad escape");
      }
    }
  }
  static json parse_value(std::string_view s, std::size_t& at) {
    skip_space(s, at);
    if (at >= s.size()) fail(at, "missing value");
    json v;
    const char c = s[at];
    if (c == '{') {
      v.type = kind::object;
      ++at;
      skip_space(s, at);
      if (at < s.size() && s[at] == '}') return ++at, v;
      while (true) {
        skip_space(s, at);
        std::string key = parse_string(s, at);
        skip_space(s, at);
        expect(s, at, ":");
        v.member_names.push_back(std::move(key));
        v.member_values.push_back(parse_value(s, at));
        skip_space(s, at);
        if (at < s.size() && s[at] == ',') {
          ++at;
          continue;
        }
        expect(s, at, "}");
        return v;
      }
    }
    if (c == '[') {
      v.type = kind::array;
      ++at;
      skip_space(s, at);
      if (at < s.size() && s[at] == ']') return ++at, v;
      while (true) {
        v.items.push_back(parse_value(s, at));
        skip_space(s, at);
        if (at < s.size() && s[at] == ',') {
          ++at;
          continue;
        }
        expect(s, at, "]");
        return v;
      }
    }
    if (c == '"') {
      v.type = kind::string;
      v.text = parse_string(s, at);
      return v;
    }
    if (s.substr(at, 4) == "true") return at += 4, v.type = kind::boolean, v.flag = true, v;
    if (s.substr(at, 5) == "false") return at += 5, v.type = kind::boolean, v;
    if (s.substr(at, 4) == "null") return at += 4, v;
    // Number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const std::size_t start = at;
    if (s[at] == '-') ++at;
    const auto digits = [&] {
      const std::size_t from = at;
      while (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at])))
        ++at;
      if (at == from) fail(at, "expected a digit");
    };
    if (at < s.size() && s[at] == '0')
      ++at;
    else
      digits();
    if (at < s.size() && s[at] == '.') {
      ++at;
      digits();
    }
    if (at < s.size() && (s[at] == 'e' || s[at] == 'E')) {
      ++at;
      if (at < s.size() && (s[at] == '+' || s[at] == '-')) ++at;
      digits();
    }
    v.type = kind::number;
    v.number = std::strtod(std::string(s.substr(start, at - start)).c_str(), nullptr);
    return v;
  }
};

}  // namespace strata_test
