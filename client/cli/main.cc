// attend: the command-line client of attend-server. See client/cli/cli.h.
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/cli.h"

int main(int argc, char** argv) {
  return attend::cli::RunCli(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
