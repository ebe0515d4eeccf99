#include "alerting/http_sender.h"

#include <curl/curl.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

class CurlSender final : public HttpSender {
 public:
  explicit CurlSender(std::chrono::milliseconds timeout) : timeout_(timeout) {
    // curl_global_init is not thread-safe: once, before any thread posts.
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }

  absl::StatusOr<int> Post(const std::string& url,
                           const std::string& json) override {
    // A handle per request: notifications are rare, and this keeps Post
    // thread-safe without a lock.
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, json.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(json.size()));
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "trainwatch");
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_.count()));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(timeout_.count()));
    // Without this, libcurl's DNS timeouts raise SIGALRM in a threaded server.
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Discard);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (rc != CURLE_OK) {
      return absl::UnavailableError(
          absl::StrCat("POST ", url, ": ", curl_easy_strerror(rc)));
    }
    return static_cast<int>(status);
  }

 private:
  const std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<HttpSender> NewCurlSender(std::chrono::milliseconds timeout) {
  return std::make_unique<CurlSender>(timeout);
}

}  // namespace trainwatch
