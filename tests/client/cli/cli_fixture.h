// ScopedColumns, and a test suite that runs the attend CLI (RunCli) against one shared in-process
// server, capturing stdout and stderr of each run.
#ifndef ATTEND_TESTS_CLIENT_CLI_CLI_FIXTURE_H_
#define ATTEND_TESTS_CLIENT_CLI_CLI_FIXTURE_H_

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "tests/server/server_fixture.h"

namespace attend::testing {

// Sets $COLUMNS (or unsets it, for nullopt) for one scope, and restores what it was.
class ScopedColumns {
 public:
  explicit ScopedColumns(std::optional<std::string> value) {
    if (const char* old = std::getenv("COLUMNS")) old_ = old;
    if (value) {
      setenv("COLUMNS", value->c_str(), 1);
    } else {
      unsetenv("COLUMNS");
    }
  }
  ~ScopedColumns() {
    if (old_) {
      setenv("COLUMNS", old_->c_str(), 1);
    } else {
      unsetenv("COLUMNS");
    }
  }

 private:
  std::optional<std::string> old_;
};

class CliServerSuite : public ServerSuite {
 protected:
  // `attend --target <the server> tokens...`; its exit code. out_ and err_ hold what it printed.
  int Run(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", absl::StrCat("127.0.0.1:", server_->port())});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }

  std::ostringstream out_, err_;
};

}  // namespace attend::testing

#endif  // ATTEND_TESTS_CLIENT_CLI_CLI_FIXTURE_H_
