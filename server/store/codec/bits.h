// Bits, most significant first: the writer and reader every column of a
// step chunk (step_codec.h) is coded with.
//
// Thread-compatible: one writer or reader per thread.
#ifndef TRAINWATCH_SERVER_STORE_CODEC_BITS_H_
#define TRAINWATCH_SERVER_STORE_CODEC_BITS_H_

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace trainwatch::codec {

class BitWriter {
 public:
  // Appends to *out, which it sizes ahead and trims in Finish().
  explicit BitWriter(std::string* out) : out_(out), len_(out->size()) {}

  // The low `bits` (0..64) bits of v.
  void Put(uint64_t v, int bits) {
    if (bits == 0) return;
    if (bits < 64) v &= (uint64_t{1} << bits) - 1;
    const int free = 64 - n_;  // 1..64
    if (bits < free) {
      acc_ = (acc_ << bits) | v;
      n_ += bits;
      return;
    }
    const int rest = bits - free;  // bits of v left over, 0..63
    const uint64_t full = (free == 64 ? 0 : acc_ << free) | (v >> rest);
    Store64(full);
    acc_ = v;  // its low `rest` bits are the pending ones
    n_ = rest;
  }
  // Room for `bits` more bits, so that Reserved::Put need not check.
  void Reserve(size_t bits) {
    const size_t need = len_ + bits / 8 + 16;
    if (out_->size() >= need) return;
    size_t size = std::max(2 * out_->size(), need + 48);
    // Within what Expect asked for, no reallocation (and its copy).
    if (need + 48 <= out_->capacity()) size = std::min(size, out_->capacity());
    out_->resize(size);
  }
  // About `bytes` more will be written: room for them, allocated once (the
  // doubling of Reserve copied a large column's bytes several times over).
  void Expect(size_t bytes) { out_->reserve(len_ + bytes + 64); }
  // The writer's state in locals, for a codec's inner loop within what
  // Reserve made room for: Put, for 1..63 bits of a v that has no higher bit
  // set. The compiler keeps it in registers, where the writer's own members
  // (stored through the string's bytes, which may alias them) are reloaded
  // after every word.
  class Reserved {
   public:
    void Put(uint64_t v, int bits) {
      const int free = 64 - n_;  // 1..64
      if (bits < free) {
        acc_ = (acc_ << bits) | v;
        n_ += bits;
        return;
      }
      const int rest = bits - free;  // free < 64 here: bits <= 63
      const uint64_t full = __builtin_bswap64((acc_ << free) | (v >> rest));
      std::memcpy(p_, &full, 8);
      p_ += 8;
      acc_ = v;
      n_ = rest;
    }

    // Put without a branch on whether a word filled, for loops of many
    // short codes: every call stores a whole word and keeps fewer than 8
    // bits pending. Needs Flush() first; bits 1..56.
    void PutFlushed(uint64_t v, int bits) {
      acc_ = (acc_ << bits) | v;
      n_ += bits;
      StorePending();
    }
    // Writes the pending whole bytes: fewer than 8 bits stay pending.
    void Flush() {
      if (n_ > 0) StorePending();
    }

   private:
    friend class BitWriter;
    Reserved(char* p, uint64_t acc, int n) : p_(p), acc_(acc), n_(n) {}
    // The n_ (1..64) pending bits as a whole word; the whole bytes among
    // them are done.
    void StorePending() {
      const uint64_t word = __builtin_bswap64(acc_ << (64 - n_));
      std::memcpy(p_, &word, 8);
      p_ += n_ >> 3;
      n_ &= 7;
    }
    char* p_;
    uint64_t acc_;
    int n_;
  };
  // Room for `bits` more bits (Reserve's), written through the Reserved it
  // returns until End.
  Reserved Begin(size_t bits) {
    Reserve(bits);
    return Reserved(out_->data() + len_, acc_, n_);
  }
  void End(const Reserved& r) {
    len_ = static_cast<size_t>(r.p_ - out_->data());
    acc_ = r.acc_;
    n_ = r.n_;
  }
  // Writes the pending bits, the last byte padded with zeros.
  void Finish() {
    const uint64_t top = n_ == 0 ? 0 : acc_ << (64 - n_);
    const int bytes = (n_ + 7) / 8;
    Store64(top);
    len_ -= 8 - bytes;
    out_->resize(len_);
    n_ = 0;
  }

 private:
  void Store64(uint64_t w) {
    if (out_->size() < len_ + 8) out_->resize(std::max(2 * out_->size(), len_ + 64));
    w = __builtin_bswap64(w);
    std::memcpy(out_->data() + len_, &w, 8);
    len_ += 8;
  }

  std::string* out_;
  size_t len_;        // bytes of *out_ written
  uint64_t acc_ = 0;  // the low n_ bits are pending
  int n_ = 0;         // 0..63
};

// Reads past the end give zeros and set failed(); callers check it once per
// column, so no read is ever out of bounds and a bad blob costs nothing more.
class BitReader {
 public:
  BitReader(const unsigned char* data, size_t size)
      : data_(data), size_(size), size_bits_(size * 8) {}

  uint64_t Get(int bits) {  // 0..64
    if (bits > 56) {
      uint64_t hi = Get(bits - 32);
      return (hi << 32) | Get(32);
    }
    if (bits == 0) return 0;
    if (pos_ + bits > size_bits_) return Fail();
    const uint64_t w = Load64(pos_ >> 3) << (pos_ & 7);
    pos_ += bits;
    return w >> (64 - bits);
  }
  // Zeros before the next one bit, which is consumed; at most `max`.
  int GetUnary(int max) {
    int zeros = 0;
    while (pos_ < size_bits_) {
      const int off = static_cast<int>(pos_ & 7);
      const uint64_t w = Load64(pos_ >> 3) << off;
      const int avail =
          static_cast<int>(std::min<size_t>(64 - off, size_bits_ - pos_));
      const int lead = w == 0 ? 64 : std::countl_zero(w);
      if (lead < avail) {
        zeros += lead;
        pos_ += lead + 1;
        if (zeros > max) break;
        return zeros;
      }
      zeros += avail;
      pos_ += avail;
      if (zeros > max) break;
    }
    Fail();
    return 0;
  }
  // An Exp-Golomb code of order k (PutGolomb), from one 64-bit window when
  // it fits in one.
  uint64_t GetGolomb(int k) {
    const int off = static_cast<int>(pos_ & 7);
    const uint64_t w = Load64(pos_ >> 3) << off;
    const int n = w == 0 ? 64 : std::countl_zero(w);
    const int len = n == 0 ? k + 1 : 2 * n + k;
    if (len <= 64 - off && pos_ + len <= size_bits_) {
      pos_ += len;
      if (n == 0) return k == 0 ? 0 : (w << 1) >> (64 - k);
      return (w << n) >> (64 - (n + k));
    }
    const int zeros = GetUnary(64);
    uint64_t v = 0;
    if (zeros > 0) v = (uint64_t{1} << (zeros - 1)) | Get(zeros - 1);
    return (v << k) | Get(k);
  }
  bool failed() const { return failed_; }
  size_t bit_pos() const { return pos_; }
  size_t size_bits() const { return size_bits_; }
  // Skips to the next byte boundary; the index of that byte.
  size_t AlignToByte() {
    pos_ = (pos_ + 7) & ~size_t{7};
    return pos_ >> 3;
  }

 private:
  uint64_t Fail() {
    failed_ = true;
    pos_ = size_bits_;
    return 0;
  }
  uint64_t Load64(size_t byte) const {
    unsigned char b[8] = {};
    if (byte + 8 <= size_) {
      std::memcpy(b, data_ + byte, 8);
    } else if (byte < size_) {
      std::memcpy(b, data_ + byte, size_ - byte);
    }
    uint64_t w;
    std::memcpy(&w, b, 8);
    return __builtin_bswap64(w);
  }

  const unsigned char* data_;
  size_t size_;
  size_t size_bits_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace trainwatch::codec

#endif  // TRAINWATCH_SERVER_STORE_CODEC_BITS_H_
