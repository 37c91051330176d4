// The command-line parse of every adgt tool: CLI11_PARSE, except that a usage
// error (an unknown flag, a missing required option, a bad value) exits 2 like
// every other input error (CLI11's own codes are 105-115); --help exits 0.
#pragma once
#include <CLI/CLI.hpp>

#define ADGT_CLI_PARSE(app, argc, argv)                  \
  try {                                                  \
    (app).parse((argc), (argv));                         \
  } catch (const CLI::ParseError& adgt_cli_e_) {         \
    const int adgt_cli_rc_ = (app).exit(adgt_cli_e_);    \
    return adgt_cli_rc_ == 0 ? 0 : 2;                    \
  }
