#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace trainwatch::testing {

std::string BinDir() { return TW_BIN_DIR; }

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tw-test-XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  if (p == nullptr) ADD_FAILURE() << "mkdtemp failed";
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

ServerProcess::ServerProcess(std::string db_path, int grpc_port,
                             std::vector<std::string> extra_args)
    : db_path_(std::move(db_path)) {
  static int counter = 0;
  log_path_ = db_path_ + ".server" + std::to_string(counter++) + ".log";
  std::vector<std::string> args = {
      BinDir() + "/trainwatch-server", "--listen",
      "127.0.0.1:" + std::to_string(grpc_port), "--metrics-listen",
      "127.0.0.1:0", "--db", db_path_};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  // Wait for "gRPC on HOST:PORT, /metrics on http(s)://HOST:PORT/metrics".
  std::regex ready(R"(gRPC on [^:]+:(\d+), /metrics on https?://([^/]+)/metrics)");
  // 30 s, as tools/tw_harness.py waits: a start on a loaded 2-core machine
  // (the full suite at -j2) took over 6 s once.
  for (int i = 0; i < 1500; ++i) {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    std::smatch m;
    std::string log = ss.str();
    if (std::regex_search(log, m, ready)) {
      grpc_port_ = std::stoi(m[1]);
      metrics_address_ = m[2];
      return;
    }
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      ADD_FAILURE() << "trainwatch-server exited at start: " << log;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "trainwatch-server did not report its ports within 30 s";
}

ServerProcess::~ServerProcess() { Kill(); }

std::string ServerProcess::grpc_address() const {
  return "127.0.0.1:" + std::to_string(grpc_port_);
}

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

int ServerProcess::Terminate() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  return out;
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv,
                  const std::string& stdin_data) {
  // stdout and stderr go to temporary files so a large output cannot block.
  TempDir dir;
  std::string out_path = dir.File("out"), err_path = dir.File("err"),
              in_path = dir.File("in");
  std::ofstream(in_path) << stdin_data;
  pid_t pid = fork();
  if (pid == 0) {
    int in = open(in_path.c_str(), O_RDONLY);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> cargs;
    for (const auto& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
    cargs.push_back(nullptr);
    execvp(cargs[0], cargs.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  int fd = open(out_path.c_str(), O_RDONLY);
  r.out = ReadAll(fd);
  close(fd);
  fd = open(err_path.c_str(), O_RDONLY);
  r.err = ReadAll(fd);
  close(fd);
  return r;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string HttpGet(const std::string& url) {
  std::smatch m;
  std::regex re(R"(http://([0-9.]+):(\d+)(/.*))");
  if (!std::regex_match(url, m, re)) return "";
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(m[2])));
  inet_pton(AF_INET, std::string(m[1]).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string req = "GET " + std::string(m[3]) + " HTTP/1.0\r\nHost: " +
                    std::string(m[1]) + "\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp = ReadAll(fd);
  close(fd);
  size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

double MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series, 0) == 0 && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nan("");
}

}  // namespace trainwatch::testing
