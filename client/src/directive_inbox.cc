#include "directive_inbox.h"

#include <algorithm>

namespace trainwatch::internal {

Directive DirectiveInbox::FromWire(const v1::Directive& d) {
  Directive out;
  out.id = d.id();
  out.seq = d.seq();
  out.for_attempt = d.for_attempt();
  out.apply_at_step = d.apply_at_step();
  out.alert = d.alert();
  out.reason = d.reason();
  out.approved_by = d.approved_by();
  switch (d.action_case()) {
    case v1::Directive::kCheckpointNow:
      out.action = Directive::Action::kCheckpointNow;
      out.checkpoint_tag = d.checkpoint_now().tag();
      break;
    case v1::Directive::kSkip:
      out.action = Directive::Action::kSkip;
      out.skip_batch_ids.assign(d.skip().batch_ids().begin(), d.skip().batch_ids().end());
      break;
    case v1::Directive::kRollback:
      out.action = Directive::Action::kRollback;
      out.rollback_to_step = d.rollback().to_step();
      out.rollback_checkpoint = d.rollback().checkpoint();
      out.skip_batch_ids.assign(d.rollback().skip_batch_ids().begin(),
                                d.rollback().skip_batch_ids().end());
      out.lr_scale = d.rollback().lr_scale() == 0 ? 1.0 : d.rollback().lr_scale();
      break;
    case v1::Directive::kScaleLr:
      out.action = Directive::Action::kScaleLr;
      out.lr_scale = d.scale_lr().factor();
      break;
    case v1::Directive::kStop:
      out.action = Directive::Action::kStop;
      out.checkpoint_first = d.stop().checkpoint_first();
      break;
    case v1::Directive::ACTION_NOT_SET:
      break;
  }
  return out;
}

std::vector<std::string> DirectiveInbox::OnResponse(
    const google::protobuf::RepeatedPtrField<v1::Directive>& directives) {
  std::vector<std::string> fresh;
  absl::MutexLock lock(&mu_);
  for (const v1::Directive& d : directives) {
    auto [it, inserted] = entries_.try_emplace(d.id());
    Entry& e = it->second;
    if (!inserted) {
      // The same directive resent, or one applied: nothing new.
      if (e.applied || d.apply_at_step() <= e.directive.apply_at_step) continue;
      if (!e.answered) {  // a later step before this client answered
        e.directive.apply_at_step = d.apply_at_step();
        continue;
      }
    }
    if (inserted || e.answered) unanswered_.fetch_add(1, std::memory_order_release);
    e.directive = FromWire(d);
    e.answered = false;
    fresh.push_back(d.id());
  }
  return fresh;
}

std::vector<Directive> DirectiveInbox::Due(uint64_t step) const {
  std::vector<Directive> out;
  // The training loop asks every step; almost always nothing is open.
  if (unanswered_.load(std::memory_order_acquire) == 0) return out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (!e.answered && e.directive.apply_at_step <= step) out.push_back(e.directive);
  }
  std::sort(out.begin(), out.end(),
            [](const Directive& a, const Directive& b) { return a.seq < b.seq; });
  return out;
}

bool DirectiveInbox::Answer(const std::string& id, DirectiveState state) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.applied) return false;
  if (state == DirectiveState::kReceived) return true;
  if (!it->second.answered) unanswered_.fetch_sub(1, std::memory_order_relaxed);
  it->second.answered = true;
  it->second.applied = state == DirectiveState::kApplied;
  return true;
}

}  // namespace trainwatch::internal
