// The key-value store the workers of a job meet at before they connect to each other (Gloo
// addresses, the NCCL unique id): rank 0 serves it over TCP, or it lives in a shared folder.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/world.h"

namespace ska::dist {

using Bytes = std::vector<char>;

// Every method may be called from any thread. Failures and timeouts are CommError naming the key
// and address().
class Store {
 public:
  explicit Store(double timeout_s) : timeout_s_(timeout_s) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The value of `key`, waiting up to timeout_s() for some worker to set it.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the integer at `key` (0 when absent) and returns the sum, atomically.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether every key is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits up to timeout_s() until every key is set.
  void wait(const std::vector<std::string>& keys);

  virtual std::string address() const = 0;  // "tcp://host:port" or "file:///folder"
  double timeout_s() const { return timeout_s_; }

 private:
  double timeout_s_;
};

// A store served by one worker over TCP with a small length-prefixed protocol. The server (rank
// 0) listens on every interface at `port` on a thread of its own until the destructor; every
// instance, the server's included, connects to host:port as a client, retrying until the timeout
// so that workers may start in any order. A client that loses its connection fails at once.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, int port, bool serve, double timeout_s);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string address() const override;
  int port() const { return port_; }  // the bound port when constructed with port 0 and serve

  class Server;

 private:
  Bytes request(char op, const std::string& key, const Bytes& payload);

  std::string host_;
  int port_;
  std::unique_ptr<Server> server_;
  std::mutex mutex_;  // one request at a time on the connection
  int fd_ = -1;       // -1 once the connection is lost
};

// A store in a folder every worker sees (NFS, Lustre): one file per key, written to a temporary
// and renamed so that readers never see half a value; add() serialises with flock(2). The folder
// must be fresh for each job: keys left by an earlier job would satisfy this one's waits.
class FileStore : public Store {
 public:
  FileStore(const std::string& folder, double timeout_s);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string address() const override { return "file://" + folder_; }

 private:
  std::string path_of(const std::string& key) const;
  void write_atomic(const std::string& path, const Bytes& value);

  std::string folder_;
};

// The store of `world`: a FileStore when MASTER_ADDR is "file:///shared/folder", else a TcpStore
// at master_addr:master_port that rank 0 serves.
std::unique_ptr<Store> make_store(const World& world, double timeout_s);

}  // namespace ska::dist
