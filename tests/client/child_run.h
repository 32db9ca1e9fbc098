// Runs code that might never stop, or might take a lot of memory, in a child process with a
// deadline and a cap on its address space, and reports how it ended, what it wrote and its peak
// resident memory (getrusage's ru_maxrss of the child alone). Tests of input limits use it so
// that a regression fails the test instead of hanging it or exhausting the machine.
//
// Thread-safety: forks; call it from a test's main thread while no other threads hold locks
// the child needs (the gtest main thread of a test that starts no threads of its own).
#ifndef ATTEND_TESTS_CLIENT_CHILD_RUN_H_
#define ATTEND_TESTS_CLIENT_CHILD_RUN_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attend::testing {

struct ChildRun {
  // Whether the child ended by itself before the deadline (it is killed otherwise).
  bool finished = false;
  // Its exit status when it exited; -1 when a signal ended it.
  int exit_code = -1;
  // What it wrote (to the pipe standing in for stdout and stderr), at most 1 MiB.
  std::string output;
  double seconds = 0;
  // Peak resident set size of the child (ru_maxrss).
  int64_t max_rss_bytes = 0;
};

// Sanitizer builds reserve terabytes of address space for their shadow memory (under an
// address-space limit they fail at start-up, "Failed to mmap") and hold freed memory in a
// quarantine, so there a child runs without RLIMIT_AS and its peak RSS is held to a looser bound
// (SanitizedRss). The Release build checks the memory bounds as the tests state them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// `bytes`, or what a sanitizer build may hold for the same work (its shadow, its quarantine and
// its larger start-up footprint): still far below the inputs the tests read.
inline int64_t SanitizedRss(int64_t bytes) {
  return kSanitizedBuild ? 3 * bytes + (int64_t{96} << 20) : bytes;
}

namespace child_run_internal {

// Forks; the child runs `child(write_fd)` under RLIMIT_AS = `address_space_bytes` (not in a
// sanitizer build) and never
// returns from it. The parent reads the pipe until EOF or `timeout_s`, then kills and reaps.
inline ChildRun Run(const std::function<void(int)>& child, double timeout_s,
                    int64_t address_space_bytes) {
  ChildRun run;
  int fds[2];
  if (pipe(fds) != 0) return run;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) return run;
  if (pid == 0) {
    close(fds[0]);
    if (!kSanitizedBuild) {
      const rlimit limit{static_cast<rlim_t>(address_space_bytes),
                         static_cast<rlim_t>(address_space_bytes)};
      setrlimit(RLIMIT_AS, &limit);
    }
    child(fds[1]);
    _exit(126);  // `child` must not return
  }
  close(fds[1]);
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  char buffer[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;  // EOF: the child is done (or closed its output)
    if (run.output.size() < (1u << 20)) run.output.append(buffer, static_cast<size_t>(n));
  }
  int status = 0;
  rusage usage{};
  // Give a child that closed its output a moment to exit; then it is over the deadline.
  while (wait4(pid, &status, WNOHANG, &usage) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      break;
    }
    usleep(1000);
  }
  close(fds[0]);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.finished = !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.max_rss_bytes = int64_t{usage.ru_maxrss} * 1024;  // Linux reports KiB
  return run;
}

inline void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace child_run_internal

// Runs `body` in a child; its result becomes ChildRun::output and the child exits 0.
inline ChildRun RunInChild(const std::function<std::string()>& body, double timeout_s,
                           int64_t address_space_bytes) {
  return child_run_internal::Run(
      [&](int fd) {
        child_run_internal::WriteAll(fd, body());
        _exit(0);
      },
      timeout_s, address_space_bytes);
}

// Runs the program argv[0] with `argv`, its stdout and stderr going to ChildRun::output.
inline ChildRun RunProgram(const std::vector<std::string>& argv, double timeout_s,
                           int64_t address_space_bytes) {
  return child_run_internal::Run(
      [&](int fd) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
        std::vector<char*> args;
        for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
      },
      timeout_s, address_space_bytes);
}

// A process that opens the FIFO `path` for writing and writes zeros until the reader goes away
// (SIGPIPE ends it). Returns its pid; the caller kills and reaps it (StopWriter).
inline pid_t StartEndlessWriter(const std::string& path) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(path.c_str(), O_WRONLY);  // blocks until a reader opens the FIFO
    if (fd < 0) _exit(1);
    static char zeros[1 << 16];
    while (write(fd, zeros, sizeof(zeros)) > 0) {
    }
    _exit(0);
  }
  return pid;
}

inline void StopWriter(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace attend::testing

#endif  // ATTEND_TESTS_CLIENT_CHILD_RUN_H_
