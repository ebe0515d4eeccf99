// The network seam of the notifiers: one HTTP POST of a JSON body. Tests use
// a recording fake; the server uses libcurl.
#ifndef TRAINWATCH_SERVER_ALERTING_HTTP_SENDER_H_
#define TRAINWATCH_SERVER_ALERTING_HTTP_SENDER_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainwatch {

// Thread-safe: Post may be called from several threads at once.
class HttpSender {
 public:
  virtual ~HttpSender() = default;
  // POSTs `json` (Content-Type: application/json) to `url`. Returns the HTTP
  // status code, or an error when no response came (refused, timed out).
  virtual absl::StatusOr<int> Post(const std::string& url,
                                   const std::string& json) = 0;
};

// libcurl. `timeout` bounds a whole request, so a receiver that accepts and
// never answers holds a notifier thread for at most that long.
std::unique_ptr<HttpSender> NewCurlSender(std::chrono::milliseconds timeout);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ALERTING_HTTP_SENDER_H_
