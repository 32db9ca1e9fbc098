// What build this is: attend's semantic version (the CMake project version) and the git commit
// it was built from, for --version, the start-up line and attend_build_info.
#ifndef ATTEND_COMMON_VERSION_VERSION_H_
#define ATTEND_COMMON_VERSION_VERSION_H_

#include <string>

#include "absl/strings/string_view.h"

namespace attend {

// "0.1.0".
absl::string_view Version();
// The short commit hash, with "-dirty" when the work tree had uncommitted changes; "unknown"
// when built outside a git checkout without ATTEND_GIT_COMMIT (e.g. from a source archive).
absl::string_view GitCommit();
// "Release", "Debug", ...: CMAKE_BUILD_TYPE.
absl::string_view BuildType();
// The initial-metadata key under which attend-server sends VersionLine("attend-server") on every
// response (server/version_metadata.h); `attend version` reads it.
inline constexpr char kServerVersionMetadata[] = "attend-server-version";

// The --version text of `program`: "attend-server 0.1.0 (commit 5b79571abc12, Release build)".
std::string VersionLine(absl::string_view program);

}  // namespace attend

#endif  // ATTEND_COMMON_VERSION_VERSION_H_
