/*
 * loadgen: a small HTTP/1.1 keep-alive load generator for Unix sockets.
 *
 * Why C and one epoll thread: the machines this benchmark runs on may have two cores, and the proxy
 * under test, the daemon behind it and the load generator all share them. A generator written in
 * Python would spend more CPU per request than the proxies do, and the measurement would be of the
 * generator. This one costs a few microseconds of CPU per request.
 *
 * Each connection has exactly one request in flight (no pipelining), as a Docker client does.
 * Latency is measured from the first byte written to the last byte of the response read.
 *
 *   loadgen -s SOCK [-c CONNS] [-d SECONDS] [-n REQUESTS] [-w WARMUP] [-m METHOD] [-p PATH]
 *           [-b BODYFILE] [-H 'Header: value']... [-T HARD_LIMIT_SECONDS]
 *
 * Prints one JSON object: counts, rate, latency percentiles (microseconds), statuses, own CPU time.
 * `requests` counts the responses inside the measured window; `completed_total` also those of the
 * warm-up and the drain, for dividing a proxy's CPU time by what it served.
 * Exit status 0 when the run completed (errors are reported in the JSON), 2 on bad arguments,
 * 3 when no connection could be opened.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { SENDING = 1, RECEIVING = 2, IDLE = 3, DEAD = 4 };

struct conn {
    int fd;
    int state;
    size_t sent;     /* bytes of the request already written */
    char *buf;       /* response bytes read so far */
    size_t len, cap;
    uint64_t t0;     /* when the request's first byte was written */
};

static char *request;
static size_t request_len;
static int is_head;
static const char *sock_path;

static uint64_t *lat;          /* latencies in ns of requests completed inside the window */
static size_t lat_len, lat_cap;
static uint64_t statuses[600];
static uint64_t errors, reconnects, completed_total;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
    exit(3);
}

static int open_conn(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, sock_path, sizeof addr.sun_path - 1);
    /* A blocking connect: on Unix sockets it returns as soon as the listener's backlog takes it. */
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void push_latency(uint64_t ns) {
    if (lat_len == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 65536;
        lat = realloc(lat, lat_cap * sizeof *lat);
        if (!lat) die("realloc");
    }
    lat[lat_len++] = ns;
}

/* Case-insensitive search for a header line's name at the start of `line`. */
static int header_is(const char *line, size_t n, const char *name) {
    size_t k = strlen(name);
    return n > k && strncasecmp(line, name, k) == 0 && line[k] == ':';
}

/*
 * Returns the length of one complete response at the start of c->buf, 0 when more bytes are
 * needed, or -1 when the response cannot be framed (it then counts as an error). Sets *status and
 * *close_after.
 */
static long complete_response(struct conn *c, int *status, int *close_after) {
    char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t head_len = (size_t)(end - c->buf) + 4;
    if (c->len < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0) return -1;
    *status = atoi(c->buf + 9);
    long content_length = -1;
    int chunked = 0;
    *close_after = 0;
    char *line = memchr(c->buf, '\n', head_len) + 1;
    while (line < c->buf + head_len - 2) {
        char *eol = memchr(line, '\n', (size_t)(c->buf + head_len - line));
        size_t n = (size_t)(eol - line);
        if (header_is(line, n, "Content-Length")) content_length = atol(line + 15);
        if (header_is(line, n, "Transfer-Encoding") && memmem(line, n, "chunked", 7)) chunked = 1;
        if (header_is(line, n, "Connection") && memmem(line, n, "close", 5)) *close_after = 1;
        line = eol + 1;
    }
    if (is_head || *status == 204 || *status == 304 || (*status >= 100 && *status < 200))
        return (long)head_len;
    if (chunked) {
        size_t pos = head_len;
        for (;;) {
            char *eol = memmem(c->buf + pos, c->len - pos, "\r\n", 2);
            if (!eol) return 0;
            unsigned long size = strtoul(c->buf + pos, NULL, 16);
            pos = (size_t)(eol - c->buf) + 2;
            if (size == 0) {
                /* No trailers is the usual case: the last chunk is followed by an empty line. */
                if (c->len - pos >= 2 && memcmp(c->buf + pos, "\r\n", 2) == 0) return (long)(pos + 2);
                char *tail = memmem(c->buf + pos, c->len - pos, "\r\n\r\n", 4);
                return tail ? (long)(tail - c->buf + 4) : 0;
            }
            if (c->len < pos + size + 2) return 0;
            pos += size + 2;
        }
    }
    if (content_length >= 0) {
        size_t total = head_len + (size_t)content_length;
        return c->len >= total ? (long)total : 0;
    }
    return -1; /* close-delimited bodies would end the keep-alive loop: treat as an error */
}

static void arm(int ep, struct conn *c, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
}

static void start_request(int ep, struct conn *c) {
    c->state = SENDING;
    c->sent = 0;
    c->len = 0;
    c->t0 = now_ns();
    for (;;) {
        ssize_t w = write(c->fd, request + c->sent, request_len - c->sent);
        if (w > 0) {
            c->sent += (size_t)w;
            if (c->sent == request_len) {
                c->state = RECEIVING;
                arm(ep, c, EPOLLIN);
                return;
            }
            continue;
        }
        if (w < 0 && errno == EAGAIN) {
            arm(ep, c, EPOLLOUT);
            return;
        }
        c->state = DEAD;
        return;
    }
}

static int reopen(int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = open_conn();
    if (c->fd < 0) {
        c->state = DEAD;
        return -1;
    }
    reconnects++;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(double p) {
    if (!lat_len) return 0;
    size_t i = (size_t)(p / 100.0 * (double)(lat_len - 1) + 0.5);
    return (double)lat[i] / 1000.0;
}

static void usage(void) {
    fprintf(stderr, "usage: loadgen -s SOCK [-c CONNS] [-d SECONDS] [-n REQUESTS] [-w WARMUP] [-m METHOD]\n"
                    "               [-p PATH] [-b BODYFILE] [-H 'Name: value']... [-T HARD_LIMIT]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int conns = 8;
    double duration = 5, warmup = 0.5, hard_limit = 0;
    long max_requests = 0;
    const char *method = "GET", *path = "/_ping", *body_file = NULL;
    char headers[8192] = "";
    int opt;
    while ((opt = getopt(argc, argv, "s:c:d:n:w:m:p:b:H:T:")) != -1) {
        switch (opt) {
        case 's': sock_path = optarg; break;
        case 'c': conns = atoi(optarg); break;
        case 'd': duration = atof(optarg); break;
        case 'n': max_requests = atol(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 'm': method = optarg; break;
        case 'p': path = optarg; break;
        case 'b': body_file = optarg; break;
        case 'H':
            if (strlen(headers) + strlen(optarg) + 3 >= sizeof headers) usage();
            strcat(headers, optarg);
            strcat(headers, "\r\n");
            break;
        case 'T': hard_limit = atof(optarg); break;
        default: usage();
        }
    }
    if (!sock_path || conns < 1 || duration <= 0) usage();
    if (hard_limit <= 0) hard_limit = warmup + duration + 10;
    is_head = strcmp(method, "HEAD") == 0;

    char *body = NULL;
    size_t body_len = 0;
    if (body_file) {
        FILE *f = fopen(body_file, "rb");
        if (!f) die(body_file);
        fseek(f, 0, SEEK_END);
        body_len = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        body = malloc(body_len + 1);
        if (!body || fread(body, 1, body_len, f) != body_len) die("read body");
        fclose(f);
    }
    request = malloc(16384 + body_len);
    int n = snprintf(request, 16384, "%s %s HTTP/1.1\r\nHost: docker\r\nUser-Agent: rediacc-bench-loadgen\r\n%s",
                     method, path, headers);
    if (body) n += snprintf(request + n, 16384 - (size_t)n, "Content-Length: %zu\r\n", body_len);
    n += snprintf(request + n, 16384 - (size_t)n, "\r\n");
    request_len = (size_t)n;
    if (body) {
        memcpy(request + request_len, body, body_len);
        request_len += body_len;
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    struct conn *cs = calloc((size_t)conns, sizeof *cs);
    for (int i = 0; i < conns; i++) {
        cs[i].fd = open_conn();
        if (cs[i].fd < 0) die(sock_path);
        cs[i].cap = 65536;
        cs[i].buf = malloc(cs[i].cap);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev) < 0) die("epoll_ctl");
    }

    uint64_t t_start = now_ns();
    uint64_t t_window = t_start + (uint64_t)(warmup * 1e9);
    uint64_t t_stop = t_window + (uint64_t)(duration * 1e9);
    uint64_t t_hard = t_start + (uint64_t)(hard_limit * 1e9);
    uint64_t in_window = 0, stopped_at = 0;
    int stopping = 0, in_flight = 0;
    struct rusage ru0;
    getrusage(RUSAGE_SELF, &ru0);

    for (int i = 0; i < conns; i++) {
        start_request(ep, &cs[i]);
        if (cs[i].state != DEAD) in_flight++;
    }

    struct epoll_event events[256];
    while (in_flight > 0) {
        uint64_t t = now_ns();
        if (t >= t_hard) break;
        if (!stopping && (t >= t_stop || (max_requests && (long)in_window >= max_requests))) {
            stopping = 1;
            stopped_at = t;
        }
        int ready = epoll_wait(ep, events, 256, 50);
        if (ready < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int e = 0; e < ready; e++) {
            struct conn *c = events[e].data.ptr;
            if (c->state == SENDING) {
                ssize_t w = write(c->fd, request + c->sent, request_len - c->sent);
                if (w > 0) {
                    c->sent += (size_t)w;
                    if (c->sent == request_len) {
                        c->state = RECEIVING;
                        arm(ep, c, EPOLLIN);
                    }
                } else if (!(w < 0 && errno == EAGAIN)) {
                    errors++;
                    if (reopen(ep, c) == 0 && !stopping) start_request(ep, c);
                    else in_flight--;
                }
                continue;
            }
            if (c->state != RECEIVING) continue;
            if (c->len == c->cap) {
                c->cap *= 2;
                c->buf = realloc(c->buf, c->cap);
                if (!c->buf) die("realloc");
            }
            ssize_t r = read(c->fd, c->buf + c->len, c->cap - c->len);
            if (r < 0 && errno == EAGAIN) continue;
            int status = 0, close_after = 0;
            long done = 0;
            if (r > 0) {
                c->len += (size_t)r;
                done = complete_response(c, &status, &close_after);
                if (done == 0) continue;
            }
            uint64_t t_done = now_ns();
            if (done > 0) {
                completed_total++;
                if (c->t0 >= t_window && (!stopping || t_done <= stopped_at)) {
                    push_latency(t_done - c->t0);
                    in_window++;
                    if (status > 0 && status < 600) statuses[status]++;
                }
            } else {
                errors++; /* closed by the peer mid-response, or unframeable */
                close_after = 1;
            }
            if (close_after && reopen(ep, c) < 0) {
                in_flight--;
                continue;
            }
            if (stopping) {
                c->state = IDLE;
                in_flight--;
                continue;
            }
            start_request(ep, c);
            if (c->state == DEAD) {
                errors++;
                in_flight--;
            }
        }
    }
    if (!stopped_at) stopped_at = now_ns();

    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) + (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                 (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
                 (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    double window = (double)(stopped_at - t_window) / 1e9;
    if (window <= 0) window = 1e-9;
    qsort(lat, lat_len, sizeof *lat, cmp_u64);
    double mean = 0;
    for (size_t i = 0; i < lat_len; i++) mean += (double)lat[i];
    mean = lat_len ? mean / (double)lat_len / 1000.0 : 0;

    printf("{\"requests\": %llu, \"duration_s\": %.6f, \"rate\": %.2f, \"errors\": %llu, \"reconnects\": %llu, "
           "\"unfinished\": %d, \"connections\": %d, \"completed_total\": %llu, ",
           (unsigned long long)in_window, window, (double)in_window / window, (unsigned long long)errors,
           (unsigned long long)reconnects, in_flight, conns, (unsigned long long)completed_total);
    printf("\"latency_us\": {\"mean\": %.1f, \"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f, \"p999\": %.1f, \"max\": %.1f}, ",
           mean, pct(50), pct(90), pct(99), pct(99.9), pct(100));
    printf("\"statuses\": {");
    int first = 1;
    for (int s = 0; s < 600; s++) {
        if (!statuses[s]) continue;
        printf("%s\"%d\": %llu", first ? "" : ", ", s, (unsigned long long)statuses[s]);
        first = 0;
    }
    printf("}, \"cpu_s\": %.3f}\n", cpu);
    return 0;
}
