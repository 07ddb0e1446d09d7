// `kvprune plot`: NLL against live KV bytes from an eval JSON, one series per policy family,
// rendered by gnuplot (Debian package gnuplot-nox).
#pragma once
#include <string>
#include <vector>

#include "eval.h"

namespace kvh {

// Parses the JSON written by `kvprune eval --json` (an array of flat objects). Unknown
// fields are ignored; a missing policy/nll/live_bytes is an error.
bool parse_results_json(const std::string &text, std::vector<EvalResult> *out, std::string *err);

// Family of a spec: the value of its `policy=` key ("full" when absent), plus the position
// mode when the spec sets one explicitly ("streaming, original positions").
std::string policy_family(const std::string &spec);

// Full path of gnuplot found in $PATH (or $KVPRUNE_GNUPLOT), "" when absent.
std::string find_gnuplot();

// The gnuplot script for results -> png_path.
std::string gnuplot_script(const std::vector<EvalResult> &rs, const std::string &png_path);

// Writes png_path; false with a message (e.g. gnuplot missing) on failure.
bool plot_results(const std::vector<EvalResult> &rs, const std::string &png_path, std::string *err);

}  // namespace kvh
