// The local files the commands read: opened with the reason when they cannot be, and .npy
// arrays bounded by what one request could carry.
//
// Thread-safety: functions of their arguments and the file system.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_INPUT_FILES_H_
#define ATTEND_CLIENT_CLI_COMMANDS_INPUT_FILES_H_

#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "client/cli/framework/command.h"
#include "client/tensor.h"

namespace attend::cli {

// `path` opened for reading, or "cannot open '<path>': <why>": no such file (NOT_FOUND), no
// permission to read it (PERMISSION_DENIED), it is a directory (FAILED_PRECONDITION), or the
// system's reason (UNKNOWN).
absl::StatusOr<std::ifstream> OpenForReading(const std::string& path);

// The array in the .npy file `path` (what --<flag> gave), opened by OpenForReading and read
// header first by client::ReadNpy, whose errors then start with "--<flag> <path>: ". The array
// may hold no more values than one request of c.connection.max_message_bytes carries at 2 bytes a
// value (client::MaxNpyValuesForMessage), so that /dev/zero, an endless FIFO or an array that
// could never be sent fails before its data is read.
absl::StatusOr<client::FloatTensor> ReadNpyFlag(const Context& c, const std::string& flag,
                                                const std::string& path);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_INPUT_FILES_H_
