// The connection's global flags of the attend CLI (--target, --deadline, --max_message_bytes,
// --tls, --ca_cert, --client_cert, --client_key, --tls_server_name, --token_file, --token,
// --keepalive_seconds), each also read from its ATTEND_* variable (a flag given on the command
// line wins), and the client::ConnectionOptions they make: PEM files and the token file read,
// the target and sizes checked.
//
// Thread-safety: ConnectionFromFlags writes to the Context it is given alone.
#ifndef ATTEND_CLIENT_CLI_CONNECT_CONNECTION_FLAGS_H_
#define ATTEND_CLIENT_CLI_CONNECT_CONNECTION_FLAGS_H_

#include <cstdint>
#include <string>

#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"
#include "client/connection.h"

namespace attend::cli {

// The connection's global flags, as given (RunCli declares them first among the global flags).
struct ConnectionFlags {
  std::string target = client::ConnectionOptions().target;
  double deadline = 30;
  ByteSize max_message_bytes{client::ConnectionOptions().max_message_bytes};
  bool tls = false;
  std::string ca_cert;
  std::string client_cert;
  std::string client_key;
  std::string tls_server_name;
  std::string token_file;
  std::string token;
  double keepalive_seconds = 0;

  void Declare(Flags& f);
};

// The connection options from the flags into c.connection. Returns kExitOk, or reports the
// problem and returns its exit code: usage for flags that do not fit together, local error for
// files that cannot be read.
int ConnectionFromFlags(Context& c, const ConnectionFlags& g);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_CONNECT_CONNECTION_FLAGS_H_
