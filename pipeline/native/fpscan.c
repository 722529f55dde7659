/* forumpulse native scanner: the byte loops of the vectorised fast path (pipeline/fastpath.py), in C.
 *
 * Plain C99, no Python headers: built into a shared library by pipeline/native/__init__.py and called through
 * ctypes (which releases the GIL for the call, so parse threads run these loops in parallel).
 *
 * fp_match   runs a "split program" over every line of a chunk: the acceptance test of a format's RE2 regex
 *            for the regexes whose every atom is one of the deterministic atoms below (the translator in
 *            pipeline/native/__init__.py refuses any other regex, which then stays with RE2), and, for accepted
 *            lines, the positions of the separators the fast path splits on (the literal spaces and quotes, and
 *            the space inside a [date time] field), in the order they occur.
 * fp_views   Arrow string_view structs (16 bytes each) for byte ranges of the chunk's buffer.
 * fp_uint    digits-or-dash fields to integers (the first 12 digits; longer values are flagged).
 * fp_count_newlines, fp_newlines  the position after every '\n' of a buffer.
 * fp_after_nth_newline           where a reader cuts a block of n lines.
 *
 * Every function reads only inside [data, data + size) as given by its offsets; none allocates or keeps state.
 */
#include <stdint.h>
#include <string.h>

enum {
    OP_LIT = 1,     /* arg: the byte */
    OP_WORD = 2,    /* [^"\t\n\v\f\r ]+ ; arg: one more excluded byte, or -1 */
    OP_ANYNQ = 3,   /* [^"]* */
    OP_DIGDASH = 4, /* \d+|- */
    OP_CLF = 5,     /* \[[^\]"WS]* [^\]"WS]*\] (the inner space is a separator) */
    OP_CLFIN = 6,   /* [^\]"WS]* [^\]"WS]* (the inner space is a separator) */
    OP_SS = 7,      /* [A-Za-z_0-9]+:[A-Za-z_0-9]+|- */
    OP_END = 8      /* (?:\r\n|\n)?$ */
};

static inline int is_ws(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == 0x0b || c == 0x0c || c == '\r';
}

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static inline int is_word(uint8_t c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* [^\]"WS]* */
static inline const uint8_t *clf_part(const uint8_t *p, const uint8_t *e) {
    while (p < e && *p != ']' && *p != '"' && !is_ws(*p)) p++;
    return p;
}

/* Match line i of the chunk; returns 1 and fills sp[0..k) when accepted. */
static int match_line(const int32_t *prog, int32_t nprog, const uint8_t *data, const uint8_t *p,
                      const uint8_t *e, int32_t *sp, int32_t k) {
    int32_t ns = 0;
    for (int32_t j = 0; j < nprog; j += 2) {
        int32_t op = prog[j], arg = prog[j + 1];
        switch (op) {
        case OP_LIT:
            if (p >= e || *p != (uint8_t)arg) return 0;
            if (arg == ' ' || arg == '"') {
                if (ns >= k) return 0;
                sp[ns++] = (int32_t)(p - data);
            }
            p++;
            break;
        case OP_WORD: {
            const uint8_t *s = p;
            while (p < e && *p != '"' && !is_ws(*p) && (int32_t)*p != arg) p++;
            if (p == s) return 0;
            break;
        }
        case OP_ANYNQ: {
            const uint8_t *q = memchr(p, '"', (size_t)(e - p));
            p = q ? q : e;
            break;
        }
        case OP_DIGDASH:
            if (p < e && *p == '-') {
                p++;
            } else {
                const uint8_t *s = p;
                while (p < e && is_digit(*p)) p++;
                if (p == s) return 0;
            }
            break;
        case OP_CLF:
            if (p >= e || *p != '[') return 0;
            p = clf_part(p + 1, e);
            if (p >= e || *p != ' ' || ns >= k) return 0;
            sp[ns++] = (int32_t)(p - data);
            p = clf_part(p + 1, e);
            if (p >= e || *p != ']') return 0;
            p++;
            break;
        case OP_CLFIN:
            p = clf_part(p, e);
            if (p >= e || *p != ' ' || ns >= k) return 0;
            sp[ns++] = (int32_t)(p - data);
            p = clf_part(p + 1, e);
            break;
        case OP_SS:
            if (p < e && *p == '-') {
                p++;
            } else {
                const uint8_t *s = p;
                while (p < e && is_word(*p)) p++;
                if (p == s || p >= e || *p != ':') return 0;
                s = ++p;
                while (p < e && is_word(*p)) p++;
                if (p == s) return 0;
            }
            break;
        case OP_END: {
            int64_t left = e - p;
            if (!(left == 0 || (left == 1 && p[0] == '\n') || (left == 2 && p[0] == '\r' && p[1] == '\n')))
                return 0;
            p = e;
            break;
        }
        default:
            return 0;
        }
    }
    return ns == k && p == e;
}

/* For each line i in [0, n) (bytes offs[i]..offs[i+1] of data) with valid[i] != 0: accept[i] = 1 when the
 * program matches the whole line, and then seps[i*k .. i*k+k) = absolute positions of its k separators.
 * Rejected or invalid lines get accept[i] = 0 (their seps row is left as it was).  Returns the accepted count.
 * Positions are int32: the caller keeps chunks under 2^31 bytes. */
int64_t fp_match(const int32_t *prog, int32_t nprog, const uint8_t *data, const int64_t *offs, int64_t n,
                 const uint8_t *valid, uint8_t *accept, int32_t *seps, int32_t k) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok = valid[i] && match_line(prog, nprog, data, data + offs[i], data + offs[i + 1], seps + i * k, k);
        accept[i] = (uint8_t)ok;
        count += ok;
    }
    return count;
}

/* Arrow string_view structs for data[a[i]:z[i]], buffer index 0: length, then the value inline when it has at
 * most 12 bytes (zero padded), else its first 4 bytes, buffer index 0 and offset a[i]. */
void fp_views(const uint8_t *data, const int64_t *a, const int64_t *z, int64_t n, uint8_t *out) {
    for (int64_t i = 0; i < n; i++) {
        uint8_t *v = out + 16 * i;
        int32_t len = (int32_t)(z[i] - a[i]);
        memset(v, 0, 16);
        memcpy(v, &len, 4);
        if (len <= 12) {
            if (len > 0) memcpy(v + 4, data + a[i], (size_t)len);
        } else {
            int32_t off = (int32_t)a[i];
            memcpy(v + 4, data + a[i], 4);
            memcpy(v + 12, &off, 4);
        }
    }
}

/* A \d+|- field: vals[i] = the number of its first 12 digits (0 for '-'), dash[i] = it is '-', too_long[i] =
 * more than 12 digits. */
void fp_uint(const uint8_t *data, const int64_t *a, const int64_t *z, int64_t n, int64_t *vals, uint8_t *dash,
             uint8_t *too_long) {
    for (int64_t i = 0; i < n; i++) {
        int64_t len = z[i] - a[i];
        const uint8_t *p = data + a[i];
        int d = len == 1 && p[0] == '-';
        int64_t v = 0;
        if (!d) {
            int64_t m = len < 12 ? len : 12;
            for (int64_t j = 0; j < m; j++) v = v * 10 + (int64_t)(p[j] - '0');
        }
        vals[i] = v;
        dash[i] = (uint8_t)d;
        too_long[i] = (uint8_t)(len > 12);
    }
}

/* The number of '\n' bytes in data[0:size). */
int64_t fp_count_newlines(const uint8_t *data, int64_t size) {
    int64_t c = 0;
    const uint8_t *p = data, *e = data + size;
    while (p < e) {
        const uint8_t *q = memchr(p, '\n', (size_t)(e - p));
        if (!q) break;
        c++;
        p = q + 1;
    }
    return c;
}

/* out[j] = position after the j-th '\n' of data[0:size), for at most cap newlines; returns the count. */
int64_t fp_newlines(const uint8_t *data, int64_t size, int64_t *out, int64_t cap) {
    int64_t c = 0;
    const uint8_t *p = data, *e = data + size;
    while (p < e && c < cap) {
        const uint8_t *q = memchr(p, '\n', (size_t)(e - p));
        if (!q) break;
        out[c++] = q - data + 1;
        p = q + 1;
    }
    return c;
}

/* The position just after the n-th '\n' at or after start in data[0:size), or -1 when there are fewer (n >= 1).
 * One memchr per line: the file reader's cuts (ingest._chunks) without Python's bytes.count, which holds the GIL
 * and scans a byte at a time. */
int64_t fp_after_nth_newline(const uint8_t *data, int64_t start, int64_t size, int64_t n) {
    const uint8_t *p = data + start, *e = data + size;
    while (p < e) {
        const uint8_t *q = memchr(p, '\n', (size_t)(e - p));
        if (!q) return -1;
        p = q + 1;
        if (--n <= 0) return p - data;
    }
    return -1;
}
