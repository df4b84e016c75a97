/// @file any_transport.hpp
/// A type-erased `transport`: one trainer instantiation serves every backend (thread_world
/// ranks, MPI processes) at the cost of one virtual call per message.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "strata/comm/concepts.hpp"

namespace strata::comm {

/// Refers to (does not own) an endpoint of any `transport` type; models `transport`.
/// Thread-safety and semantics are the wrapped endpoint's.
class any_transport {
 public:
  template <transport T>
  requires(!std::is_same_v<std::remove_cvref_t<T>, any_transport>) explicit any_transport(
      T& endpoint)
      : self_(std::make_unique<model<T>>(endpoint)) {}

  [[nodiscard]] int rank() const { return self_->rank(); }
  [[nodiscard]] int size() const { return self_->size(); }
  [[nodiscard]] double timeout_seconds() const { return self_->timeout_seconds(); }
  [[nodiscard]] std::uint64_t bytes_sent_to(int peer) const { return self_->bytes_sent_to(peer); }
  [[nodiscard]] std::uint64_t bytes_received_from(int peer) const {
    return self_->bytes_received_from(peer);
  }
  void send(int peer, tag_t tag, std::span<const std::byte> bytes) {
    self_->send(peer, tag, bytes);
  }
  /// Sends `bytes`, moving the vector into the message where the endpoint can
  /// (`thread_transport::send_owned`; `bytes` is left empty); elsewhere sends a copy and
  /// leaves `bytes` as it was.
  void send_owned(int peer, tag_t tag, std::vector<std::byte>&& bytes) {
    self_->send_owned(peer, tag, std::move(bytes));
  }
  /// The endpoint's recycled buffer of capacity ≥ `bytes` (`thread_transport::take_buffer`);
  /// an empty vector where the endpoint keeps none.
  [[nodiscard]] std::vector<std::byte> take_buffer(std::size_t bytes) {
    return self_->take_buffer(bytes);
  }
  /// Hands a received message's buffer back (`thread_transport::recycle`); elsewhere frees it.
  void recycle(std::vector<std::byte>&& bytes) { self_->recycle(std::move(bytes)); }
  void recv(int peer, tag_t tag, std::span<std::byte> bytes) { self_->recv(peer, tag, bytes); }
  std::vector<std::byte> recv_message(int peer, tag_t tag) {
    return self_->recv_message(peer, tag);
  }
  message recv_any(tag_t tag) { return self_->recv_any(tag); }
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                tag_t tag) {
    self_->sendrecv(to, out, from, in, tag);
  }

 private:
  struct concept_base {
    virtual ~concept_base() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual double timeout_seconds() const = 0;
    virtual std::uint64_t bytes_sent_to(int) const = 0;
    virtual std::uint64_t bytes_received_from(int) const = 0;
    virtual void send(int, tag_t, std::span<const std::byte>) = 0;
    virtual void send_owned(int, tag_t, std::vector<std::byte>&&) = 0;
    virtual std::vector<std::byte> take_buffer(std::size_t) = 0;
    virtual void recycle(std::vector<std::byte>&&) = 0;
    virtual void recv(int, tag_t, std::span<std::byte>) = 0;
    virtual std::vector<std::byte> recv_message(int, tag_t) = 0;
    virtual message recv_any(tag_t) = 0;
    virtual void sendrecv(int, std::span<const std::byte>, int, std::span<std::byte>, tag_t) = 0;
  };
  template <class T>
  struct model final : concept_base {
    explicit model(T& e) : endpoint(&e) {}
    int rank() const override { return endpoint->rank(); }
    int size() const override { return endpoint->size(); }
    double timeout_seconds() const override { return endpoint->timeout_seconds(); }
    std::uint64_t bytes_sent_to(int p) const override { return endpoint->bytes_sent_to(p); }
    std::uint64_t bytes_received_from(int p) const override {
      return endpoint->bytes_received_from(p);
    }
    void send(int p, tag_t t, std::span<const std::byte> b) override { endpoint->send(p, t, b); }
    void send_owned(int p, tag_t t, std::vector<std::byte>&& b) override {
      send_moving(*endpoint, p, t, b);
    }
    std::vector<std::byte> take_buffer(std::size_t bytes) override {
      return take_recycled(*endpoint, bytes);
    }
    void recycle(std::vector<std::byte>&& b) override { comm::recycle(*endpoint, std::move(b)); }
    void recv(int p, tag_t t, std::span<std::byte> b) override { endpoint->recv(p, t, b); }
    std::vector<std::byte> recv_message(int p, tag_t t) override {
      return endpoint->recv_message(p, t);
    }
    message recv_any(tag_t t) override { return endpoint->recv_any(t); }
    void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                  tag_t t) override {
      endpoint->sendrecv(to, out, from, in, t);
    }
    T* endpoint;
  };
  std::unique_ptr<concept_base> self_;
};

static_assert(transport<any_transport>);

}  // namespace strata::comm
