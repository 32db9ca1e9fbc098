// KvCache's SaveSequence and LoadSequence: one sequence to and from the server's snapshot
// directory (server/snapshot_store.h). The rest of the service is in kv_cache_service.cc.
#include <chrono>
#include <string>

#include "core/base/status_macros.h"
#include "core/kv_cache/sequence_registry.h"
#include "server/convert/kv_cache.h"
#include "server/kv_cache_service.h"

namespace attend::server {

grpc::ServerUnaryReactor* KvCacheService::SaveSequence(grpc::CallbackServerContext* context,
                                                       const v1::SaveSequenceRequest* request,
                                                       v1::SaveSequenceResponse* response) {
  return RunKv(
      context, "SaveSequence",
      [this, request, response, route = RouteOf(*context)](const CallWork& work) -> absl::Status {
        ATTEND_RETURN_IF_ERROR(RequireId(request->sequence_id(), "sequence_id"));
        ATTEND_RETURN_IF_ERROR(CheckRoute(route, request->sequence_id(), "sequence_id"));
        if (snapshots_ == nullptr) {
          return absl::FailedPreconditionError(
              "SaveSequence: this server has no snapshot directory (start it with "
              "--snapshot_dir)");
        }
        const auto start = std::chrono::steady_clock::now();
        ATTEND_ASSIGN_OR_RETURN(
            const int64_t bytes,
            snapshots_->SaveOne(*cache_, request->sequence_id(), request->name(), work.cancel));
        response->set_name(request->name().empty() ? request->sequence_id() : request->name());
        response->set_bytes(bytes);
        response->set_seconds(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::LoadSequence(grpc::CallbackServerContext* context,
                                                       const v1::LoadSequenceRequest* request,
                                                       v1::SequenceInfo* response) {
  return RunKv(
      context, "LoadSequence",
      [this, request, response, route = RouteOf(*context)](const CallWork& work) -> absl::Status {
        if (request->name().empty()) {
          return absl::InvalidArgumentError("name: empty; give the name it was saved under");
        }
        if (snapshots_ == nullptr) {
          return absl::FailedPreconditionError(
              "LoadSequence: this server has no snapshot directory (start it with "
              "--snapshot_dir)");
        }
        // The sequence the call makes must route where the call went: its id is the one asked
        // for, or the one in the file.
        std::string id = request->sequence_id();
        if (id.empty()) {
          ATTEND_ASSIGN_OR_RETURN(id, snapshots_->SavedId(request->name()));
        } else {
          ATTEND_RETURN_IF_ERROR(kv::CheckSequenceId(id, "sequence_id"));
        }
        ATTEND_RETURN_IF_ERROR(CheckRoute(
            route, id, request->sequence_id().empty() ? "the saved sequence's id" : "sequence_id"));
        ATTEND_ASSIGN_OR_RETURN(const kv::SequenceInfo info,
                                snapshots_->LoadOne(*cache_, request->name(), id, work.cancel));
        ToProto(info, response);
        return absl::OkStatus();
      });
}

}  // namespace attend::server
