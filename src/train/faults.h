// Fault injection for the fault tests (docs/reliability.md), read from the environment by
// FaultPlan::from_env and nowhere else. Every variable is unset in normal runs, and then nothing
// here changes what the engine does.
//   MOETRAIN_FAULT_KILL_AT_BYTE=N   SIGKILL the process when a checkpoint save has written N bytes
//                                   (counted over every file the save writes, in write order, so
//                                   N may fall inside a tensor, a header or a JSON file)
//   MOETRAIN_FAULT_KILL_AT=POINT    SIGKILL at a named point of a save: complete (every file
//                                   written and synced, before the directory is put in place),
//                                   installed (after that, before `latest`), latest (after
//                                   `latest`, before the displaced directory is deleted)
//   MOETRAIN_FAULT_KILL_SAVE_STEP=S the kills above apply to the save of step S only (default:
//                                   any save)
//   MOETRAIN_FAULT_ENOSPC_SAVE_STEP=S  the save of step S fails as on a full disk (an IoError
//                                   "No space left on device" naming its first file)
//   MOETRAIN_FAULT_NAN=loss|grad    make step MOETRAIN_FAULT_NAN_STEP's loss, or one gradient
//   MOETRAIN_FAULT_NAN_STEP=S       element, NaN; on a mesh only on MOETRAIN_FAULT_NAN_RANK
//   MOETRAIN_FAULT_NAN_RANK=R       (default 0)
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace mt {

struct FaultPlan {
  int64_t kill_at_byte = -1;
  std::string kill_at;
  int64_t kill_save_step = -1;
  int64_t enospc_save_step = -1;
  std::string nan;  // "", "loss" or "grad"
  int64_t nan_step = -1;
  int nan_rank = 0;

  static FaultPlan from_env();
  // Whether the NaN injection applies to this step on this rank.
  bool nan_at(const char* what, int64_t step, int rank) const {
    return nan == what && step == nan_step && rank == nan_rank;
  }
};

// The byte counter and kill points of one checkpoint save. The byte kill is exact without a
// hook in every writer: before each file the process's file-size limit (RLIMIT_FSIZE) is set to
// the bytes left, so the kernel stops the write that would cross byte N and raises SIGXFSZ, whose
// handler sends SIGKILL. The limit is lifted again once the file is written.
class SaveFaults {
 public:
  SaveFaults(const FaultPlan& plan, int64_t step);
  ~SaveFaults();
  SaveFaults(const SaveFaults&) = delete;
  SaveFaults& operator=(const SaveFaults&) = delete;
  // Around each file the save writes; before_file throws the injected ENOSPC.
  void before_file(const std::filesystem::path& file);
  void after_file(const std::filesystem::path& written);
  // A named point of the save.
  void point(const char* name) const;

 private:
  void disarm();
  bool active_ = false, enospc_ = false;
  int64_t kill_at_byte_ = -1, written_ = 0;
  std::string kill_at_;
  bool armed_ = false;
  rlimit saved_limit_{};
};

}  // namespace mt
