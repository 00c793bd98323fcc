/* Loaded into a local run's tasks (LD_PRELOAD, see loopback.py): a socket that asks for
 * every interface gets this machine's loopback instead.
 *
 * Why: TensorFlow's gRPC server always binds every interface (0.0.0.0 / [::]) and
 * authenticates nobody; a local cluster only ever talks over loopback. Rewriting the
 * wildcard at bind() keeps the tasks' ports off the network while everything else --
 * connecting to this machine's 127.0.0.1 services, outbound traffic -- stays as it is.
 *
 *   0.0.0.0:P                      -> 127.0.0.1:P
 *   [::]:P, IPV6_V6ONLY            -> [::1]:P
 *   [::]:P, dual-stack (the usual) -> [::ffff:127.0.0.1]:P (IPv4 127.0.0.1 connections)
 *
 * listen() on a socket never bound (the kernel would bind the wildcard) is bound to the
 * loopback first. A specific address is left alone: a program that names an interface
 * asked for it.
 *
 * The system calls are made directly (syscall(2)), not through dlsym(RTLD_NEXT): the
 * library then needs nothing newer than glibc 2.2.5's symbols, so the copy built once
 * and shipped with tfrun (scripts/build_loopback_bind.sh) loads on any glibc Linux.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static int real_bind(int fd, const struct sockaddr *address, socklen_t size) {
  return (int)syscall(SYS_bind, fd, address, size);
}

static int real_listen(int fd, int backlog) {
  return (int)syscall(SYS_listen, fd, backlog);
}

static void copy_bytes(void *to, const void *from, unsigned long size) {
  unsigned char *out = to;
  const unsigned char *in = from;
  while (size--) *out++ = *in++;
}

static void zero_bytes(void *to, unsigned long size) {
  unsigned char *out = to;
  while (size--) *out++ = 0;
}

static int is_dual_stack(int fd) {
  int v6only = 0;
  socklen_t size = sizeof v6only;
  if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &size) != 0) return 0;
  return !v6only;
}

static void set_loopback6(int fd, struct in6_addr *address) {
  if (is_dual_stack(fd)) {
    zero_bytes(address, sizeof *address);  /* ::ffff:127.0.0.1 */
    address->s6_addr[10] = 0xff;
    address->s6_addr[11] = 0xff;
    address->s6_addr[12] = 127;
    address->s6_addr[15] = 1;
  } else {
    *address = in6addr_loopback;
  }
}

int bind(int fd, const struct sockaddr *address, socklen_t size) {
  if (address && address->sa_family == AF_INET && size >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in ipv4;
    copy_bytes(&ipv4, address, sizeof ipv4);
    if (ipv4.sin_addr.s_addr == htonl(INADDR_ANY)) {
      ipv4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&ipv4, sizeof ipv4);
    }
  } else if (address && address->sa_family == AF_INET6 && size >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 ipv6;
    copy_bytes(&ipv6, address, sizeof ipv6);
    if (IN6_IS_ADDR_UNSPECIFIED(&ipv6.sin6_addr)) {
      set_loopback6(fd, &ipv6.sin6_addr);
      return real_bind(fd, (const struct sockaddr *)&ipv6, sizeof ipv6);
    }
  }
  return real_bind(fd, address, size);
}

int listen(int fd, int backlog) {
  struct sockaddr_storage own;
  socklen_t size = sizeof own;
  zero_bytes(&own, sizeof own);
  if (getsockname(fd, (struct sockaddr *)&own, &size) == 0) {
    if (own.ss_family == AF_INET) {
      struct sockaddr_in *ipv4 = (struct sockaddr_in *)&own;
      if (ipv4->sin_port == 0 && ipv4->sin_addr.s_addr == htonl(INADDR_ANY)) {
        ipv4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        real_bind(fd, (const struct sockaddr *)ipv4, sizeof *ipv4);  /* failing: as before */
      }
    } else if (own.ss_family == AF_INET6) {
      struct sockaddr_in6 *ipv6 = (struct sockaddr_in6 *)&own;
      if (ipv6->sin6_port == 0 && IN6_IS_ADDR_UNSPECIFIED(&ipv6->sin6_addr)) {
        set_loopback6(fd, &ipv6->sin6_addr);
        real_bind(fd, (const struct sockaddr *)ipv6, sizeof *ipv6);
      }
    }
  }
  return real_listen(fd, backlog);
}
