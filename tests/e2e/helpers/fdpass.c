/* What a tenant brings into its containers to keep a device after its holder is gone: a descriptor
 * handed over a Unix socket (SCM_RIGHTS), which no path names and no device cgroup checks.
 *
 *   fdpass hold SOCKET PROGRAM [ARG...]   listen on SOCKET, take one descriptor, exec PROGRAM with it
 *   fdpass send SOCKET FD                 send descriptor FD to whoever holds SOCKET
 *   fdpass inflight SOCKET TRIGGER        take one descriptor on SOCKET, send it into a socketpair of
 *                                         its own and close it (in flight: no fd table, no memory map
 *                                         holds the file); once TRIGGER exists, take it back and read
 *                                         one byte of the device, then sleep
 *
 * Built static (cc -static) so it runs in a busybox image. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int unix_socket(const char *path, struct sockaddr_un *addr) {
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    if (sock < 0 || strlen(path) >= sizeof(addr->sun_path)) {
        perror("socket");
        exit(2);
    }
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    strcpy(addr->sun_path, path);
    return sock;
}

static int receive_fd(int sock);
static int send_on(int sock, int fd);

static int take(const char *path) {
    struct sockaddr_un addr;
    int sock = unix_socket(path, &addr);
    unlink(path);
    if (bind(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(sock, 1) < 0) {
        perror("bind");
        exit(2);
    }
    int peer = accept(sock, NULL, NULL);
    int fd = peer < 0 ? -1 : receive_fd(peer);
    close(peer);
    close(sock);
    return fd;
}

static int inflight(const char *path, const char *trigger) {
    int fd = take(path);
    int pair[2];
    if (fd < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0 || send_on(pair[0], fd) != 0) {
        fputs("could not put the descriptor in flight\n", stderr);
        return 2;
    }
    close(fd);
    printf("in flight\n");
    fflush(stdout);
    while (access(trigger, F_OK) != 0)
        usleep(100000);
    int back = receive_fd(pair[1]);
    char byte;
    if (back >= 0 && read(back, &byte, 1) == 1)
        printf("read 1 byte from the device\n");
    else
        printf("the descriptor did not come back\n");
    fflush(stdout);
    pause();
    return 0;
}

static int receive_fd(int sock) {
    char byte;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } control;
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    if (recvmsg(sock, &msg, 0) <= 0)
        return -1;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg == NULL || cmsg->cmsg_type != SCM_RIGHTS)
        return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(cmsg), sizeof(fd));
    return fd;
}

static int send_on(int sock, int fd) {
    char byte = 0;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } control;
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(fd));
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int hold(const char *path, char **program) {
    struct sockaddr_un addr;
    int sock = unix_socket(path, &addr);
    unlink(path);
    if (bind(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(sock, 1) < 0) {
        perror("bind");
        return 2;
    }
    int peer = accept(sock, NULL, NULL);
    char byte;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } control;
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    if (peer < 0 || recvmsg(peer, &msg, 0) <= 0) {
        perror("recvmsg");
        return 2;
    }
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg == NULL || cmsg->cmsg_type != SCM_RIGHTS) {
        fputs("no descriptor came\n", stderr);
        return 2;
    }
    int fd;
    memcpy(&fd, CMSG_DATA(cmsg), sizeof(fd));
    close(peer);
    close(sock);
    printf("holding fd %d\n", fd);
    fflush(stdout);
    execvp(program[0], program); /* the descriptor stays open across exec */
    perror("exec");
    return 2;
}

static int send_fd(const char *path, int fd) {
    struct sockaddr_un addr;
    int sock = unix_socket(path, &addr);
    if (connect(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        perror("connect");
        return 2;
    }
    char byte = 0;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } control;
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(fd));
    if (sendmsg(sock, &msg, 0) != 1) {
        perror("sendmsg");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "hold") == 0)
        return hold(argv[2], argv + 3);
    if (argc == 4 && strcmp(argv[1], "send") == 0)
        return send_fd(argv[2], atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "inflight") == 0)
        return inflight(argv[2], argv[3]);
    fputs("usage: fdpass hold SOCKET PROGRAM [ARG...] | fdpass send SOCKET FD | fdpass inflight SOCKET TRIGGER\n",
          stderr);
    return 64;
}
