// `kvprune plot`: NLL against live KV bytes from an eval JSON, one series per policy family,
// rendered by gnuplot (Debian package gnuplot-nox).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "eval.h"

namespace kvh {

// A results file is a JSON array of flat objects: each row's fields in file order, scalars as
// their text (strings unescaped; numbers, true/false/null as written).
struct JsonField {
    std::string text;
    bool is_str = false;
};
using JsonRow = std::vector<std::pair<std::string, JsonField>>;
bool parse_json_rows(const std::string &text, std::vector<JsonRow> *rows, std::string *err);
// A number field (null = NaN); an unsigned integer field in 0..hi, range-checked before the cast.
bool json_field_number(const std::string &key, const JsonField &f, double *v, std::string *err);
bool json_field_uint(const std::string &key, const JsonField &f, double hi, uint64_t *out, std::string *err);

// Parses the JSON written by `kvprune eval --json` (an array of flat objects). Unknown fields
// are ignored; a missing policy/nll/live_bytes is an error, and so is a number outside its
// field's range (byte counts: integers in 0..2^53; tokens/prefill: integers in 0..2^31-1; nll and
// friends: finite or null), checked before any conversion.
bool parse_results_json(const std::string &text, std::vector<EvalResult> *out, std::string *err);

// The series of a spec in plots and task tables: the value of its `policy=` key ("full" when
// absent), then every other key but those a budget curve moves along (budget, window, capacity,
// extra, compression_ratio, ThinK's channel ratios), in the spec's order, then the position mode when
// the spec sets one ("streaming sinks=4, original positions", "h2o kv_dtype=q4"): specs that differ
// in anything else (kv_dtype, ThinK's token policy, sinks, ...) get series of their own.
std::string policy_family(const std::string &spec);

// Full path of gnuplot found in $PATH (or $KVPRUNE_GNUPLOT), "" when absent.
std::string find_gnuplot();

struct PlotOptions {
    std::string format = "png";  // png | svg
    std::string x = "auto";      // auto | bytes | n: x axis (auto: n when every series has one point per N)
};

// "bytes" or "n": the x axis the options and results give.
std::string plot_x_axis(const std::vector<EvalResult> &rs, const PlotOptions &o);

// "png" or "svg" for an output path and an explicit --format ("" = from the extension).
std::string plot_format(const std::string &out_path, const std::string &format);

// The gnuplot script (terminal excluded) for results -> out_path ("" = gnuplot's stdout).
std::string gnuplot_script(const std::vector<EvalResult> &rs, const std::string &out_path,
                           const PlotOptions &o = PlotOptions());

// Refusals checked before gnuplot runs: an image to a terminal ("-" with stdout a tty, PNG),
// an output path whose folder is missing or not writable, or which is a folder.
bool check_plot_output(const std::string &out_path, const std::string &format, bool stdout_is_tty, std::string *err);

// Writes out_path ("-" = stdout); false with a message (e.g. gnuplot missing) on failure.
bool plot_results(const std::vector<EvalResult> &rs, const std::string &out_path, const PlotOptions &o,
                  std::string *err);

// Runs gnuplot on make_script(file) (the script writes `file`) with a PNG or SVG terminal of
// width x height, into out_path ("-" = stdout, through a temporary file); the refusals of
// check_plot_output first; false with a message (e.g. gnuplot missing) on failure.
bool render_plot(const std::function<std::string(const std::string &)> &make_script, const std::string &out_path,
                 const std::string &format, int width, int height, std::string *err);

// An output file can be created or overwritten (checked before long runs start).
bool check_writable(const std::string &path, std::string *err);

}  // namespace kvh
