#include "trainwatch/v1/packed_counts.h"

#include <array>
#include <bit>
#include <cstring>

namespace trainwatch::v1::wire {
namespace {

namespace pbi = google::protobuf::internal;

constexpr uint64_t kHighBits = 0x8080808080808080;
constexpr int kMaxVarint = 10;  // bytes of a 64-bit varint, as protobuf's
constexpr size_t kBlock = 64;   // bytes whose varints' ends one mask holds

uint64_t Load8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

// How many varints end in [p, end): the bytes without their high bit,
// summed a byte lane at a time (no popcount instruction in the baseline
// x86-64 build), then the lanes summed by one multiply into the top byte,
// which holds at most 255: so at most 31 words (248 ends) a round.
constexpr int kWordsPerCount = 255 / 8;

size_t CountEnds(const char* p, const char* end) {
  size_t n = 0;
  while (end - p >= 8) {
    uint64_t lanes = 0;
    for (int k = 0; k < kWordsPerCount && end - p >= 8; ++k, p += 8) {
      lanes += (~Load8(p) & kHighBits) >> 7;
    }
    n += (lanes * 0x0101010101010101) >> 56;
  }
  for (; p < end; ++p) n += (static_cast<uint8_t>(*p) & 0x80) == 0;
  return n;
}

// Bit j: byte j of the word ends a varint (its high bit is clear).
uint64_t EndsOf(uint64_t word) {
  return (((~word & kHighBits) >> 7) * 0x0102040810204080) >> 56;
}

// The 7-bit groups of a varint of n bytes in the word that begins with it.
constexpr std::array<uint64_t, 9> kGroups = [] {
  std::array<uint64_t, 9> m{};
  for (int n = 1; n <= 8; ++n) m[n] = (n == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n)) - 1) & ~kHighBits;
  return m;
}();

// One varint at p, byte by byte; nullptr when it is over 10 bytes. Its
// value modulo 2^64, as protobuf's VarintParse gives it.
const char* DecodeOne(const char* p, uint64_t* value) {
  uint64_t v = 0;
  for (int i = 0; i < kMaxVarint; ++i) {
    const auto byte = static_cast<uint8_t>(p[i]);
    v |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if (byte < 0x80) {
      *value = v;
      return p + i + 1;
    }
  }
  return nullptr;
}

// The varints that end in the block of 64 bytes at base + at, their ends'
// mask `ends`; `start` is where the first begins (before the block when a
// varint crosses into it), and 8 bytes from any start are readable. Each
// varint of at most 8 bytes is taken from one word by its length, which
// comes from the mask, not from the bytes before it: the varints do not
// wait on each other's loads. Returns false on a varint over 10 bytes.
bool DecodeBlock(const char* base, size_t at, uint64_t ends, size_t& start_io,
                 uint64_t*& dst_io) {
  // In locals: a count's store could alias them through the references.
  size_t start = start_io;
  uint64_t* dst = dst_io;
  bool ok = true;
  while (ends != 0) {
    const size_t end = at + static_cast<size_t>(std::countr_zero(ends));
    ends &= ends - 1;
    const size_t len = end - start + 1;
    if (len <= 8) [[likely]] {
      uint64_t x = Load8(base + start) & kGroups[len];
      x = ((x & 0x7f007f007f007f00) >> 1) | (x & 0x007f007f007f007f);
      x = ((x & 0x3fff00003fff0000) >> 2) | (x & 0x00003fff00003fff);
      x = ((x & 0x0fffffff00000000) >> 4) | (x & 0x000000000fffffff);
      *dst++ = x;
    } else if (DecodeOne(base + start, dst++) != base + end + 1) {
      ok = false;
      break;
    }
    start = end + 1;
  }
  start_io = start;
  dst_io = dst;
  return ok;
}

// The varints of [p, p + size) into dst; the last byte ends one.
bool DecodeAll(const char* p, size_t size, uint64_t* dst) {
  size_t start = 0, at = 0;
  // Whole blocks while a load from any start in them stays in the field.
  for (; at + kBlock + 8 <= size; at += kBlock) {
    uint64_t ends = 0;
    for (size_t k = 0; k < kBlock / 8; ++k) ends |= EndsOf(Load8(p + at + 8 * k)) << (8 * k);
    if (!DecodeBlock(p, at, ends, start, dst)) return false;
    // A varint under way for over 10 bytes is malformed (as protobuf's
    // parser has it), and would not fit the tail below.
    if (at + kBlock - start > kMaxVarint) return false;
  }
  // The rest, from the varint under way, copied where 8 bytes past any
  // start are readable (under 64 + 8 + 10 bytes).
  alignas(8) char tail[2 * kBlock + 16] = {};
  const size_t rest = size - start;
  std::memcpy(tail, p + start, rest);
  start = 0;
  for (at = 0; at < rest; at += kBlock) {
    uint64_t ends = 0;
    for (size_t k = 0; k < kBlock / 8; ++k) ends |= EndsOf(Load8(tail + at + 8 * k)) << (8 * k);
    if (rest - at < kBlock) ends &= (uint64_t{1} << (rest - at)) - 1;
    if (!DecodeBlock(tail, at, ends, start, dst)) return false;
  }
  return true;
}

}  // namespace

const char* ParsePackedCounts(google::protobuf::RepeatedField<uint64_t>* out,
                              const char* ptr, pbi::ParseContext* ctx) {
  if constexpr (std::endian::native == std::endian::little) {
    const char* data = ptr;
    const uint32_t size = pbi::ReadSize(&data);
    // The field whole in the current buffer and within the enclosing
    // message (its last byte before both ends): decoded here. Otherwise, or
    // a malformed length, protobuf's parser takes it from the start and
    // fails as it would.
    if (data != nullptr && size > 0 && ctx->DataAvailable(data + (size - 1))) {
      const char* end = data + size;
      if (static_cast<uint8_t>(end[-1]) >= 0x80) return nullptr;  // the last varint is cut
      const size_t n = CountEnds(data, end);
      out->Reserve(out->size() + static_cast<int>(n));
      if (!DecodeAll(data, size, out->AddNAlreadyReserved(static_cast<int>(n)))) return nullptr;
      return end;
    }
  }
  return pbi::PackedUInt64Parser(out, ptr, ctx);
}

}  // namespace trainwatch::v1::wire
