/* What a tenant brings into its containers to keep a device after its holder is gone: a descriptor
 * handed over a Unix socket (SCM_RIGHTS), which no path names and no device cgroup checks.
 *
 *   fdpass hold SOCKET PROGRAM [ARG...]   listen on SOCKET, take one descriptor, exec PROGRAM with it
 *   fdpass send SOCKET FD                 send descriptor FD to whoever holds SOCKET
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
    fputs("usage: fdpass hold SOCKET PROGRAM [ARG...] | fdpass send SOCKET FD\n", stderr);
    return 64;
}
