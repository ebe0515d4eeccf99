// Helpers for integration tests: run the real trainwatch-server binary on
// free loopback ports with a temporary database, run commands, fetch /metrics.
#ifndef TRAINWATCH_TESTS_INTEGRATION_HARNESS_H_
#define TRAINWATCH_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace trainwatch::testing {

// Directory of the built binaries (build/bin).
std::string BinDir();

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One trainwatch-server process. Not thread-safe.
class ServerProcess {
 public:
  // Starts on free ports (port 0) unless `grpc_port` is given, and waits
  // until it prints where it listens. Fails the test loudly otherwise.
  explicit ServerProcess(std::string db_path, int grpc_port = 0,
                         std::vector<std::string> extra_args = {});
  ~ServerProcess();  // SIGKILL if still running

  std::string grpc_address() const;
  int grpc_port() const { return grpc_port_; }
  std::string metrics_url() const { return "http://" + metrics_address_ + "/metrics"; }
  pid_t pid() const { return pid_; }

  void Kill();       // SIGKILL, reaped
  int Terminate();   // SIGTERM; returns the exit status (or -signal)
  const std::string& log_path() const { return log_path_; }

 private:
  std::string db_path_;
  std::string log_path_;
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  std::string metrics_address_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs argv (no shell), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv,
                  const std::string& stdin_data = "");

// A loopback TCP port that was free a moment ago (bound to port 0, then
// closed), for a process the test starts that takes its port as a flag.
int FreePort();

// GET over plain HTTP; returns the body, or "" on failure.
std::string HttpGet(const std::string& url);

// Value of a Prometheus sample in `text` whose line starts with `series`
// (e.g. `trainwatch_steps_total{run="r"}`); NaN when absent.
double MetricValue(const std::string& text, const std::string& series);

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_INTEGRATION_HARNESS_H_
