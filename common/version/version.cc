#include "common/version/version.h"

#include "absl/strings/str_cat.h"
#include "attend_git_commit.h"  // generated: ATTEND_GIT_COMMIT

namespace attend {

absl::string_view Version() { return ATTEND_VERSION; }
absl::string_view GitCommit() { return ATTEND_GIT_COMMIT; }
absl::string_view BuildType() { return ATTEND_BUILD_TYPE; }

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", Version(), " (commit ", GitCommit(), ", ", BuildType(),
                      " build)");
}

}  // namespace attend
