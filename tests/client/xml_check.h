// Checks of the SVG documents the CLI writes, shared by its tests: a small well-formedness
// checker (no XML library is linked) and python3's xml.etree as an independent parser.
#ifndef ATTEND_TESTS_CLIENT_XML_CHECK_H_
#define ATTEND_TESTS_CLIENT_XML_CHECK_H_

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace attend::testing {

// "" when `doc` is well-formed XML of the kind an SVG writer produces (an XML declaration,
// comments, elements with quoted, unique attributes, text, the five predefined entities and
// character references, one root element), otherwise what is wrong and where.
inline std::string XmlProblem(const std::string& doc) {
  const size_t n = doc.size();
  size_t i = 0;
  std::vector<std::string> open;
  bool root_seen = false;
  const auto at = [&](const std::string& what) { return absl::StrCat(what, " at offset ", i); };
  const auto name_start = [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  };
  const auto name_char = [&](char c) {
    return name_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  };
  const auto read_name = [&] {
    const size_t start = i;
    if (i < n && name_start(doc[i])) {
      while (i < n && name_char(doc[i])) ++i;
    }
    return doc.substr(start, i - start);
  };
  const auto skip_space = [&] {
    const size_t start = i;
    while (i < n && std::isspace(static_cast<unsigned char>(doc[i]))) ++i;
    return i > start;
  };
  // At '&': a predefined entity or a character reference.
  const auto reference = [&]() -> bool {
    const size_t semi = doc.find(';', i);
    if (semi == std::string::npos) return false;
    const std::string ref = doc.substr(i + 1, semi - i - 1);
    static const std::set<std::string> kNamed = {"amp", "lt", "gt", "quot", "apos"};
    bool ok = kNamed.count(ref) > 0;
    if (!ok && ref.size() > 1 && ref[0] == '#') {
      const bool hex = ref[1] == 'x';
      const std::string digits = ref.substr(hex ? 2 : 1);
      ok = !digits.empty();
      for (char c : digits) {
        ok = ok && (hex ? std::isxdigit(static_cast<unsigned char>(c))
                        : std::isdigit(static_cast<unsigned char>(c)));
      }
    }
    i = semi + 1;
    return ok;
  };

  if (doc.compare(0, 5, "<?xml") == 0) {
    const size_t end = doc.find("?>");
    if (end == std::string::npos) return at("unterminated XML declaration");
    i = end + 2;
  }
  while (i < n) {
    const char c = doc[i];
    if (c == '<') {
      if (doc.compare(i, 4, "<!--") == 0) {
        const size_t end = doc.find("-->", i + 4);
        if (end == std::string::npos) return at("unterminated comment");
        i = end + 3;
        continue;
      }
      if (doc.compare(i, 2, "<!") == 0 || doc.compare(i, 2, "<?") == 0) {
        return at("unexpected markup declaration");
      }
      if (doc.compare(i, 2, "</") == 0) {
        i += 2;
        const std::string name = read_name();
        skip_space();
        if (i >= n || doc[i] != '>') return at("malformed end tag");
        ++i;
        if (open.empty() || open.back() != name) {
          return at(
              absl::StrCat("</", name, "> does not close <", open.empty() ? "" : open.back(), ">"));
        }
        open.pop_back();
        continue;
      }
      ++i;
      if (root_seen && open.empty()) return at("a second root element");
      const std::string name = read_name();
      if (name.empty()) return at("an element without a name");
      std::set<std::string> attributes;
      bool self_closing = false;
      while (true) {
        const bool space = skip_space();
        if (i >= n) return at("unterminated start tag");
        if (doc[i] == '>') {
          ++i;
          break;
        }
        if (doc.compare(i, 2, "/>") == 0) {
          i += 2;
          self_closing = true;
          break;
        }
        if (!space) return at("attributes must be separated by white space");
        const std::string attribute = read_name();
        if (attribute.empty()) return at("malformed attribute");
        if (!attributes.insert(attribute).second) return at("duplicate attribute " + attribute);
        skip_space();
        if (i >= n || doc[i] != '=') return at("attribute without '='");
        ++i;
        skip_space();
        if (i >= n || (doc[i] != '"' && doc[i] != '\'')) return at("unquoted attribute value");
        const char quote = doc[i++];
        while (i < n && doc[i] != quote) {
          if (doc[i] == '<') return at("'<' in an attribute value");
          if (doc[i] == '&') {
            if (!reference()) return at("bad reference in an attribute value");
          } else {
            ++i;
          }
        }
        if (i >= n) return at("unterminated attribute value");
        ++i;
      }
      root_seen = true;
      if (!self_closing) open.push_back(name);
    } else if (c == '&') {
      if (open.empty()) return at("a reference outside the root element");
      if (!reference()) return at("bad reference");
    } else {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(c))) {
        return at("text outside the root element");
      }
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        return at("a control character");
      }
      ++i;
    }
  }
  if (!open.empty()) return absl::StrCat("<", open.back(), "> is never closed");
  if (!root_seen) return "no root element";
  return "";
}

// The content of the file at `path` ("" when it cannot be read): a document a command wrote.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the python3 `script` on the document `svg` (saved in the test's temporary directory and
// passed as sys.argv[1]); what it prints, or why it failed. The files carry the process id:
// ctest runs tests as parallel processes that share one temporary directory.
inline std::string RunPythonOn(const std::string& svg, const std::string& script,
                               const std::string& name) {
  const std::string stem = absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
  const std::string path = stem + ".svg", script_path = stem + ".py";
  std::ofstream(path, std::ios::binary) << svg;
  std::ofstream(script_path) << script;
  FILE* pipe =
      popen(absl::StrCat("/usr/bin/python3 ", script_path, " ", path, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  const int status = pclose(pipe);
  std::remove(path.c_str());
  std::remove(script_path.c_str());
  return status == 0 ? out : absl::StrCat("python3 failed (", status, "): ", out);
}

// The data-series of the SVG's polylines as python3's xml.etree reads them, one per line.
inline std::string PythonSeries(const std::string& svg) {
  return RunPythonOn(svg,
                     "import sys, xml.etree.ElementTree as ET\n"
                     "root = ET.parse(sys.argv[1]).getroot()\n"
                     "assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag\n"
                     "for p in root.iter('{http://www.w3.org/2000/svg}polyline'):\n"
                     "    print(p.get('data-series'))\n",
                     "svg_series");
}

// The heatmap cells of the SVG as python3's xml.etree reads them, one line each:
// "<head> <row> <col> <value> <masked|visible>|<tooltip>".
inline std::string PythonHeatmapCells(const std::string& svg) {
  return RunPythonOn(svg,
                     "import sys, xml.etree.ElementTree as ET\n"
                     "ns = '{http://www.w3.org/2000/svg}'\n"
                     "root = ET.parse(sys.argv[1]).getroot()\n"
                     "assert root.tag == ns + 'svg', root.tag\n"
                     "for r in root.iter(ns + 'rect'):\n"
                     "    if r.get('class') != 'cell': continue\n"
                     "    t = r.find(ns + 'title')\n"
                     "    print(r.get('data-head'), r.get('data-row'), r.get('data-col'),\n"
                     "          r.get('data-value'),\n"
                     "          'masked' if r.get('data-masked') == 'true' else 'visible',\n"
                     "          end='|')\n"
                     "    print(t.text if t is not None else '')\n",
                     "svg_heatmap");
}

// For each element `tag` (in the SVG namespace) whose class is `cls` ("" for any), in document
// order, a line with the value of `what` as python3's xml.etree reads it: an attribute's value
// ("" when absent), or with what = "text" the element's text content.
inline std::string PythonSelect(const std::string& svg, const std::string& tag,
                                const std::string& cls, const std::string& what) {
  return RunPythonOn(svg,
                     absl::StrCat("import sys, xml.etree.ElementTree as ET\n"
                                  "ns = '{http://www.w3.org/2000/svg}'\n"
                                  "root = ET.parse(sys.argv[1]).getroot()\n"
                                  "assert root.tag == ns + 'svg', root.tag\n"
                                  "for e in root.iter(ns + '",
                                  tag, "'):\n    if '", cls, "' and e.get('class') != '", cls,
                                  "': continue\n    print(",
                                  what == "text" ? std::string("''.join(e.itertext())")
                                                 : absl::StrCat("e.get('", what, "', '')"),
                                  ")\n"),
                     "svg_select");
}

}  // namespace attend::testing

#endif  // ATTEND_TESTS_CLIENT_XML_CHECK_H_
