// The address a rank binds and announces for its peers (Gloo, NCCL's store). Torch-free.
#pragma once
#include <string>

namespace gp::runtime {

/// The address of this host's interface that routes to `host` (a name or an address; found by
/// connecting a UDP socket to it, nothing is sent), for Gloo to bind and announce on multi-node
/// runs: a host name that resolves to loopback in /etc/hosts (the usual Debian setup) would make
/// every rank announce 127.0.0.1 to its peers. "" when `host` does not resolve or has no route.
std::string local_address_towards(const std::string& host);

}  // namespace gp::runtime
