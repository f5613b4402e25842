/* slipstream.logbuffer._fastpath: the log buffer's hot loops in C.
 *
 * The pure-Python code in appender.py and reader.py is the reference; every function here must give
 * the same log bytes, positions and delivered fragments (tests/test_fastpath.py checks it). Anything
 * off the common path (back pressure, term rotation, cleaning ahead, errors) is handed back to the
 * Python methods, so only the hot loop lives here.
 *
 * Safety: every read and write is bounds-checked against the length of the buffer the object exports
 * (the mapping), never against a length word found in it. The frame length is stored last with a
 * release store; x86-64 keeps stores in order across processes, which the log format relies on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <sys/un.h>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "slipstream's log format is little-endian; this host is not"
#endif

#define HEADER_LENGTH 32
#define TYPE_OFFSET 6
#define HDR_TYPE_PAD 0
#define HDR_TYPE_DATA 1
#define BEGIN_FLAG 0x80
#define END_FLAG 0x40
#define ALIGN32(x) (((x) + 31) & ~(int64_t)31)

static PyObject *str_py_offer, *str_py_claim, *str_wrap, *str_offset, *str_buffer, *str_clean_ahead;

/* ---- small helpers ----------------------------------------------------------------------------- */

static inline int32_t load_i32(const char *p) {
    int32_t v;
    if (((uintptr_t)p & 3) == 0) {
        return __atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE);
    }
    memcpy(&v, p, 4);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return v;
}

static inline void store_i32_release(char *p, int32_t v) {
    if (((uintptr_t)p & 3) == 0) {
        __atomic_store_n((int32_t *)p, v, __ATOMIC_RELEASE);
    } else {
        __atomic_thread_fence(__ATOMIC_RELEASE);
        memcpy(p, &v, 4);
    }
}

static inline void store_i64_release(char *p, int64_t v) {
    if (((uintptr_t)p & 7) == 0) {
        __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE);
    } else {
        __atomic_thread_fence(__ATOMIC_RELEASE);
        memcpy(p, &v, 8);
    }
}

static inline void write_header(char *p, int32_t frame_length, uint8_t flags, uint16_t type, int32_t term_offset,
                                int32_t session_id, int32_t stream_id, int32_t term_id, int64_t reserved) {
    int32_t negated = -frame_length;
    uint8_t version = 0;
    memcpy(p, &negated, 4);
    memcpy(p + 4, &version, 1);
    memcpy(p + 5, &flags, 1);
    memcpy(p + 6, &type, 2);
    memcpy(p + 8, &term_offset, 4);
    memcpy(p + 12, &session_id, 4);
    memcpy(p + 16, &stream_id, 4);
    memcpy(p + 20, &term_id, 4);
    memcpy(p + 24, &reserved, 8);
}

/* Whether ``index`` names a whole int64 in a buffer of ``length`` bytes (no overflow for any index). */
static inline int i64_index_ok(long long index, Py_ssize_t length) {
    return index >= 0 && index < (long long)(length / 8);
}

/* Read element ``index`` of an int64 buffer (a counter view), bounds-checked. */
static int read_i64_at(PyObject *obj, long long index, int64_t *out) {
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (!i64_index_ok(index, b.len)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_IndexError, "counter index outside its buffer");
        return -1;
    }
    int64_t v;
    const char *p = (const char *)b.buf + index * 8;
    if (((uintptr_t)p & 7) == 0) {
        v = __atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE);
    } else {
        memcpy(&v, p, 8);
    }
    *out = v;
    PyBuffer_Release(&b);
    return 0;
}

/* A payload's bytes, as len(payload) counts them in Python: only byte-formatted 1-D buffers qualify
 * (anything else is left to the Python path, which decides what it means). Returns 1 if usable. */
static int payload_buffer(PyObject *payload, Py_buffer *pb) {
    if (PyBytes_CheckExact(payload) || PyByteArray_CheckExact(payload)) {
        return PyObject_GetBuffer(payload, pb, PyBUF_SIMPLE) == 0 ? 1 : -1;
    }
    if (PyObject_GetBuffer(payload, pb, PyBUF_ND | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = pb->format;
    int byte_format = f == NULL || ((f[0] == 'B' || f[0] == 'b' || f[0] == 'c') && f[1] == '\0');
    if (pb->ndim != 1 || pb->itemsize != 1 || !byte_format) {
        PyBuffer_Release(pb);
        return 0;
    }
    return 1;
}

/* ---- AppenderCore ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    long long term_offset;
    long long term_begin_position;
    long long check_offset;
    long long term_length;
    long long term_id_shifted;
    long long active_index;
    long long term_id;
    long long session_id;
    long long stream_id;
    long long max_payload;
    long long max_message_length;
    long long limit_index;
    long long parked_index;
    PyObject *term;
    PyObject *term_i32;
    PyObject *tail_i64;
    PyObject *limit_values;
    PyObject *parked;
    PyObject *wake;
} AppenderCore;

static int core_traverse(AppenderCore *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->term);
    Py_VISIT(self->term_i32);
    Py_VISIT(self->tail_i64);
    Py_VISIT(self->limit_values);
    Py_VISIT(self->parked);
    Py_VISIT(self->wake);
    return 0;
}

static int core_clear(AppenderCore *self) {
    Py_CLEAR(self->term);
    Py_CLEAR(self->term_i32);
    Py_CLEAR(self->tail_i64);
    Py_CLEAR(self->limit_values);
    Py_CLEAR(self->parked);
    Py_CLEAR(self->wake);
    return 0;
}

static void core_dealloc(AppenderCore *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    core_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Call the wake hook (a reader is parked) and hand ``result`` back; NULL (result released) if it raised. */
static PyObject *call_wake(AppenderCore *self, PyObject *result) {
    if (self->wake != NULL) {
        PyObject *wake = Py_NewRef(self->wake); /* held for its call: it may replace the appender's hook */
        PyObject *r = PyObject_CallNoArgs(wake);
        Py_DECREF(wake);
        if (r == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(r);
    }
    return result;
}

static PyObject *ring_doorbell(AppenderCore *self, PyObject *result) {
    if (self->parked != NULL && self->parked != Py_None) {
        int64_t flag;
        if (read_i64_at(self->parked, self->parked_index, &flag) < 0) {
            Py_DECREF(result);
            return NULL;
        }
        if (flag) {
            return call_wake(self, result);
        }
    }
    return result;
}

/* Hand the call to the Python method ``name`` with every argument as given (positional and keyword), so a
 * call the C path does not take (a wrong argument count, keywords, an unusual payload) behaves exactly as
 * the pure-Python method: same result, same TypeError. */
static PyObject *fallback(PyObject *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t total = nargs + nkw;
    PyObject *stack[8];
    PyObject **call = stack;
    if (total + 1 > (Py_ssize_t)(sizeof stack / sizeof stack[0])) {
        call = PyMem_New(PyObject *, (size_t)(total + 1));
        if (call == NULL) {
            return PyErr_NoMemory();
        }
    }
    call[0] = self;
    for (Py_ssize_t i = 0; i < total; i++) {
        call[i + 1] = args[i];
    }
    PyObject *result = PyObject_VectorcallMethod(name, call, (size_t)(nargs + 1), nkw ? kwnames : NULL);
    if (call != stack) {
        PyMem_Free(call);
    }
    return result;
}

/* offer(payload, reserved_value=0): the common case in C; anything else goes to _py_offer. */
static PyObject *core_offer(AppenderCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
#define OFFER_FALLBACK() fallback((PyObject *)self, str_py_offer, args, nargs, kwnames)
    if (nargs < 1 || nargs > 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        return OFFER_FALLBACK();
    }
    int64_t reserved = 0;
    if (nargs == 2) {
        reserved = PyLong_AsLongLong(args[1]);
        if (reserved == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return OFFER_FALLBACK();
        }
    }
    /* The payload's buffer before any of the appender's state: converting the reserved value and getting
     * a buffer may run Python code (__index__, __buffer__), which may use this appender. */
    Py_buffer pb;
    int usable = payload_buffer(args[0], &pb);
    if (usable < 0) {
        return NULL;
    }
    if (usable == 0) {
        return OFFER_FALLBACK();
    }
    if (self->term == NULL || self->tail_i64 == NULL || self->limit_values == NULL) {
        PyBuffer_Release(&pb);
        return OFFER_FALLBACK();
    }
    int64_t term_offset = self->term_offset;
    int64_t position;
    int64_t limit;
    if (term_offset < 0 || __builtin_add_overflow(self->term_begin_position, term_offset, &position)) {
        PyBuffer_Release(&pb);
        return OFFER_FALLBACK();
    }
    if (read_i64_at(self->limit_values, self->limit_index, &limit) < 0) {
        PyBuffer_Release(&pb);
        return NULL;
    }
    if (position >= limit) {
        PyBuffer_Release(&pb);
        return OFFER_FALLBACK();
    }
    int64_t length = pb.len;
    int64_t max_payload = self->max_payload;
    int64_t required;
    if (length > max_payload) {
        if (length > self->max_message_length || max_payload <= 0 || max_payload > INT32_MAX - 64) {
            PyBuffer_Release(&pb);
            return OFFER_FALLBACK();
        }
        int64_t full = length / max_payload, last = length % max_payload;
        required = full * ALIGN32(max_payload + HEADER_LENGTH) + (last ? ALIGN32(last + HEADER_LENGTH) : 0);
    } else {
        required = ALIGN32(length + HEADER_LENGTH);
    }
    int64_t resulting;
    if (__builtin_add_overflow(term_offset, required, &resulting)) {
        PyBuffer_Release(&pb);
        return OFFER_FALLBACK();
    }
    if (resulting > self->check_offset) {
        /* Zero more of the next partition first, as _py_offer does (_clean_ahead), and append here: a
         * stream of large messages crosses the check offset on nearly every offer. A term's end is
         * Python's. */
        if (resulting > self->term_length) {
            PyBuffer_Release(&pb);
            return OFFER_FALLBACK();
        }
        PyObject *at = PyLong_FromLongLong(resulting);
        PyObject *cleaned = at ? PyObject_CallMethodOneArg((PyObject *)self, str_clean_ahead, at) : NULL;
        Py_XDECREF(at);
        if (cleaned == NULL) {
            PyBuffer_Release(&pb);
            return NULL;
        }
        Py_DECREF(cleaned);
        /* Python ran: everything below is read again (the buffers, the tail index, the ids), and the
         * offset this append was planned at must still be the appender's */
        if (resulting > self->check_offset || self->term_offset != term_offset || self->term == NULL ||
            self->tail_i64 == NULL) {
            PyBuffer_Release(&pb);
            return OFFER_FALLBACK();
        }
    }
    Py_buffer tb, mb;
    if (PyObject_GetBuffer(self->term, &tb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&pb);
        return NULL;
    }
    if (resulting > (int64_t)tb.len) {
        PyBuffer_Release(&tb);
        PyBuffer_Release(&pb);
        return OFFER_FALLBACK();
    }
    if (self->tail_i64 == NULL || PyObject_GetBuffer(self->tail_i64, &mb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&tb);
        PyBuffer_Release(&pb);
        if (!PyErr_Occurred()) {
            return OFFER_FALLBACK();
        }
        return NULL;
    }
    if (!i64_index_ok(self->active_index, mb.len)) {
        PyBuffer_Release(&mb);
        PyBuffer_Release(&tb);
        PyBuffer_Release(&pb);
        return OFFER_FALLBACK();
    }
#undef OFFER_FALLBACK
    char *term = (char *)tb.buf;
    const char *src = (const char *)pb.buf;
    int32_t session_id = (int32_t)self->session_id, stream_id = (int32_t)self->stream_id;
    int32_t term_id = (int32_t)self->term_id;
    if (length <= max_payload) {
        char *p = term + term_offset;
        int32_t frame_length = (int32_t)(length + HEADER_LENGTH);
        write_header(p, frame_length, BEGIN_FLAG | END_FLAG, HDR_TYPE_DATA, (int32_t)term_offset, session_id, stream_id,
                     term_id, reserved);
        memcpy(p + HEADER_LENGTH, src, (size_t)length);
        store_i32_release(p, frame_length);
    } else {
        int64_t offset = term_offset, consumed = 0;
        uint8_t flags = BEGIN_FLAG;
        while (consumed < length) {
            int64_t chunk = length - consumed < max_payload ? length - consumed : max_payload;
            if (consumed + chunk == length) {
                flags |= END_FLAG;
            }
            int32_t frame_length = (int32_t)(chunk + HEADER_LENGTH);
            char *p = term + offset;
            write_header(p, frame_length, flags, HDR_TYPE_DATA, (int32_t)offset, session_id, stream_id, term_id,
                         reserved);
            memcpy(p + HEADER_LENGTH, src + consumed, (size_t)chunk);
            store_i32_release(p, frame_length);
            consumed += chunk;
            offset += ALIGN32(frame_length);
            flags = 0;
        }
    }
    self->term_offset = resulting;
    store_i64_release((char *)mb.buf + self->active_index * 8, self->term_id_shifted | resulting);
    /* An IPC log's parking table lives in the metadata whose buffer we hold already: the doorbell check
     * is then one 8-byte read, with no second buffer request. */
    int parked_read = 0;
    int64_t parked = 0;
    if (self->parked == self->tail_i64 && i64_index_ok(self->parked_index, mb.len)) {
        parked = __atomic_load_n((const int64_t *)((char *)mb.buf + self->parked_index * 8), __ATOMIC_RELAXED);
        parked_read = 1;
    }
    PyBuffer_Release(&mb);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&pb);
    PyObject *result = PyLong_FromLongLong(position + required);
    if (result == NULL) {
        return NULL;
    }
    if (parked_read) {
        return parked ? call_wake(self, result) : result;
    }
    return ring_doorbell(self, result);
}

/* claim(length, limit, claim): reserve one unfragmented frame; anything unusual goes to _py_claim. */
static PyObject *core_claim(AppenderCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
#define CLAIM_FALLBACK() fallback((PyObject *)self, str_py_claim, args, nargs, kwnames)
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || !PyLong_CheckExact(args[0]) ||
        !PyLong_CheckExact(args[1]) || self->term == NULL || self->term_i32 == NULL || self->tail_i64 == NULL) {
        return CLAIM_FALLBACK();
    }
    int overflow = 0;
    long long length = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    long long limit = overflow ? 0 : PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || length < 0 || length > self->max_payload || length > INT32_MAX - 64) {
        return CLAIM_FALLBACK();
    }
    int64_t term_offset = self->term_offset;
    int64_t position;
    int64_t frame_length = length + HEADER_LENGTH;
    int64_t resulting;
    if (term_offset < 0 || __builtin_add_overflow(self->term_begin_position, term_offset, &position) ||
        __builtin_add_overflow(term_offset, ALIGN32(frame_length), &resulting)) {
        return CLAIM_FALLBACK();
    }
    if (position >= limit || resulting > self->check_offset) {
        return CLAIM_FALLBACK();
    }
    Py_buffer tb, mb;
    if (PyObject_GetBuffer(self->term, &tb, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (resulting > (int64_t)tb.len) {
        PyBuffer_Release(&tb);
        return CLAIM_FALLBACK();
    }
    if (PyObject_GetBuffer(self->tail_i64, &mb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    if (!i64_index_ok(self->active_index, mb.len)) {
        PyBuffer_Release(&mb);
        PyBuffer_Release(&tb);
        return CLAIM_FALLBACK();
    }
#undef CLAIM_FALLBACK
    write_header((char *)tb.buf + term_offset, (int32_t)frame_length, BEGIN_FLAG | END_FLAG, HDR_TYPE_DATA,
                 (int32_t)term_offset, (int32_t)self->session_id, (int32_t)self->stream_id, (int32_t)self->term_id, 0);
    PyBuffer_Release(&tb);
    PyObject *wrap_args[5];
    PyObject *offset_obj = PyLong_FromLongLong(term_offset);
    PyObject *length_obj = offset_obj ? PyLong_FromLongLong(frame_length) : NULL;
    if (length_obj == NULL) {
        Py_XDECREF(offset_obj);
        PyBuffer_Release(&mb);
        return NULL;
    }
    /* held for the call: _wrap is Python and may replace the appender's attributes */
    wrap_args[0] = args[2];
    wrap_args[1] = Py_NewRef(self->term);
    wrap_args[2] = Py_NewRef(self->term_i32);
    wrap_args[3] = offset_obj;
    wrap_args[4] = length_obj;
    PyObject *r = PyObject_VectorcallMethod(str_wrap, wrap_args, 5, NULL);
    for (int i = 1; i < 5; i++) {
        Py_DECREF(wrap_args[i]);
    }
    if (r == NULL) {
        PyBuffer_Release(&mb);
        return NULL;
    }
    Py_DECREF(r);
    self->term_offset = resulting;
    /* _wrap ran Python: the tail view and its index are read again, as _py_claim reads them after the call.
     * The buffer held is written only if it is still the appender's and the index is inside it; otherwise
     * the store is the Python one (``self._tail_i64[self._active_index] = ...``), with its errors. */
    int64_t tail_value = self->term_id_shifted | resulting;
    long long index = self->active_index;
    PyObject *tail = self->tail_i64;
    if (tail != NULL && tail == mb.obj && i64_index_ok(index, mb.len)) {
        store_i64_release((char *)mb.buf + index * 8, tail_value);
        PyBuffer_Release(&mb);
    } else {
        PyBuffer_Release(&mb);
        if (tail == NULL) {
            PyErr_SetString(PyExc_AttributeError, "_tail_i64");
            return NULL;
        }
        Py_INCREF(tail);
        PyObject *key = PyLong_FromLongLong(index);
        PyObject *value = key ? PyLong_FromLongLong(tail_value) : NULL;
        int stored = value ? PyObject_SetItem(tail, key, value) : -1;
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_DECREF(tail);
        if (stored < 0) {
            return NULL;
        }
    }
    return PyLong_FromLongLong(position + resulting - term_offset);
}

static PyMethodDef core_methods[] = {
    {"offer", (PyCFunction)(void (*)(void))core_offer, METH_FASTCALL | METH_KEYWORDS,
     "offer(payload, reserved_value=0) -> position or a negative result code."},
    {"claim", (PyCFunction)(void (*)(void))core_claim, METH_FASTCALL | METH_KEYWORDS,
     "claim(length, limit, claim) -> position or a negative result code."},
    {NULL, NULL, 0, NULL},
};

#define LL(name, field) {name, T_LONGLONG, offsetof(AppenderCore, field), 0, NULL}
/* T_OBJECT_EX: a deleted attribute raises AttributeError when read, as a Python slot does (T_OBJECT would
 * give None), so the Python methods behave as the reference's when the C path hands a call to them */
#define OBJ(name, field) {name, T_OBJECT_EX, offsetof(AppenderCore, field), 0, NULL}
static PyMemberDef core_members[] = {
    LL("_term_offset", term_offset),
    LL("_term_begin_position", term_begin_position),
    LL("_check_offset", check_offset),
    LL("_term_length", term_length),
    LL("_term_id_shifted", term_id_shifted),
    LL("_active_index", active_index),
    LL("_term_id", term_id),
    LL("_session_id", session_id),
    LL("_stream_id", stream_id),
    LL("_max_payload", max_payload),
    LL("_max_message_length", max_message_length),
    LL("_limit_index", limit_index),
    LL("_parked_index", parked_index),
    OBJ("_term", term),
    OBJ("_term_i32", term_i32),
    OBJ("_tail_i64", tail_i64),
    OBJ("_limit_values", limit_values),
    OBJ("_parked", parked),
    OBJ("_wake", wake),
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_doc, "The appender's hot state and its offer/claim fast paths; a Python subclass does the rest."},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_clear},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec core_spec = {
    "slipstream.logbuffer._fastpath.AppenderCore",
    sizeof(AppenderCore),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    core_slots,
};

/* ---- reading ----------------------------------------------------------------------------------- */

/* A view of term[start:start+length] sharing the term memoryview's export (what slicing does,
 * without building a slice object). */
static PyObject *sub_view(PyObject *term, int fast, Py_ssize_t start, Py_ssize_t length) {
    if (fast) {
        PyObject *mv = PyMemoryView_FromObject(term);
        if (mv == NULL) {
            return NULL;
        }
        Py_buffer *v = PyMemoryView_GET_BUFFER(mv);
        v->buf = (char *)v->buf + start;
        v->len = length;
        v->shape[0] = length;
        return mv;
    }
    return PySequence_GetSlice(term, start, start + length);
}

/* Whether ``term`` is a 1-D, byte-sized, contiguous memoryview (so sub_view may adjust a copy). */
static int plain_byte_view(PyObject *term) {
    if (!PyMemoryView_Check(term)) {
        return 0;
    }
    Py_buffer *v = PyMemoryView_GET_BUFFER(term);
    return v->ndim == 1 && v->itemsize == 1 && v->shape != NULL && (v->strides == NULL || v->strides[0] == 1) &&
           v->suboffsets == NULL;
}

static int set_header_offset(PyObject *header, Py_ssize_t offset) {
    PyObject *o = PyLong_FromSsize_t(offset);
    if (o == NULL) {
        return -1;
    }
    int r = PyObject_SetAttr(header, str_offset, o);
    Py_DECREF(o);
    return r;
}

static PyObject *read_result(long long fragments, Py_ssize_t offset, int intact) {
    return Py_BuildValue("(LnO)", fragments, offset, intact ? Py_True : Py_False);
}

/* ---- AssemblerCore ----------------------------------------------------------------------------- */

/* FragmentAssembler's state and logic (assembler.py's PyFragmentAssembler is the reference). read_term
 * recognises it as the handler and assembles in C: a fragment that is not a whole message costs a copy
 * and no Python call, and the wrapped handler is called once per message. */

#define FLAGS_OFFSET 5
#define SESSION_ID_OFFSET 12
#define UNFRAGMENTED (BEGIN_FLAG | END_FLAG)
#define ASSEMBLER_KEEP_LIMIT (1 << 20) /* a session's buffer above this is dropped after its message */

typedef struct {
    int32_t session_id;
    Py_ssize_t length;      /* bytes of the partial message so far; 0: none in progress */
    Py_ssize_t next_offset; /* where the next fragment must start */
    char next_reachable;    /* 0: that offset is beyond int64 (a hostile header): no fragment continues */
    PyObject *buffer;       /* bytearray, grown as needed; NULL until first used */
} Partial;

typedef struct {
    PyObject_HEAD
    PyObject *handler;
    Partial *partials;
    Py_ssize_t count;
    Py_ssize_t capacity;
} AssemblerCore;

static PyTypeObject *assembler_type;
static PyObject *str_release, *str_flags, *str_session_id, *str_frame_length;

static int assembler_traverse(AssemblerCore *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->handler);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Py_VISIT(self->partials[i].buffer);
    }
    return 0;
}

static int assembler_clear(AssemblerCore *self) {
    Py_CLEAR(self->handler);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Py_CLEAR(self->partials[i].buffer);
    }
    self->count = 0;
    return 0;
}

static void assembler_dealloc(AssemblerCore *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    assembler_clear(self);
    PyMem_Free(self->partials);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int assembler_init(AssemblerCore *self, PyObject *args, PyObject *kwargs) {
    PyObject *handler;
    static char *names[] = {"handler", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:FragmentAssembler", names, &handler)) {
        return -1;
    }
    Py_INCREF(handler);
    Py_XSETREF(self->handler, handler);
    return 0;
}

static Partial *find_partial(AssemblerCore *self, int32_t session_id) {
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (self->partials[i].session_id == session_id) {
            return &self->partials[i];
        }
    }
    return NULL;
}

static Partial *add_partial(AssemblerCore *self, int32_t session_id) {
    if (self->count == self->capacity) {
        Py_ssize_t capacity = self->capacity ? self->capacity * 2 : 4;
        Partial *grown = PyMem_Realloc(self->partials, (size_t)capacity * sizeof(Partial));
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->partials = grown;
        self->capacity = capacity;
    }
    Partial *p = &self->partials[self->count++];
    p->session_id = session_id;
    p->length = 0;
    p->next_offset = 0;
    p->next_reachable = 1;
    p->buffer = NULL;
    return p;
}

/* Make room for ``needed`` bytes, keeping the partial message. A buffer a handler still holds a view of
 * (it kept the message past its call) is left to it and replaced. */
static int reserve(Partial *p, Py_ssize_t needed) {
    PyObject *buffer = p->buffer;
    if (buffer != NULL && ((PyByteArrayObject *)buffer)->ob_exports == 0) {
        Py_ssize_t size = PyByteArray_GET_SIZE(buffer);
        if (size >= needed) {
            return 0;
        }
        return PyByteArray_Resize(buffer, needed > size * 2 ? needed : size * 2);
    }
    PyObject *fresh = PyByteArray_FromStringAndSize(NULL, needed < 4096 ? 4096 : needed);
    if (fresh == NULL) {
        return -1;
    }
    if (p->length > 0) {
        memcpy(PyByteArray_AS_STRING(fresh), PyByteArray_AS_STRING(buffer), (size_t)p->length);
    }
    Py_XSETREF(p->buffer, fresh);
    return 0;
}

/* Hand the whole message to the handler as a view of exactly its bytes, released after the call. */
static int deliver(AssemblerCore *self, Partial *p, PyObject *header) {
    if (self->handler == NULL) {
        p->length = 0;
        PyErr_SetString(PyExc_RuntimeError, "FragmentAssembler was not initialised");
        return -1;
    }
    PyObject *buffer = p->buffer;
    int32_t session_id = p->session_id;
    PyObject *view = PyMemoryView_FromObject(buffer);
    if (view == NULL) {
        p->length = 0;
        return -1;
    }
    Py_buffer *v = PyMemoryView_GET_BUFFER(view);
    v->len = p->length;
    v->shape[0] = p->length;
    p->length = 0;
    /* The handler may use this assembler again (free a session, poll with it): ``p`` is not valid after
     * the call, the handler is held for it, and the session is found again by its id. */
    PyObject *handler = Py_NewRef(self->handler);
    PyObject *call[2] = {view, header};
    PyObject *r = PyObject_Vectorcall(handler, call, 2, NULL);
    Py_DECREF(handler);
    if (r == NULL) {
        /* the handler's error wins over the release's (as a with block's body over its exit) */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *released = PyObject_CallMethodNoArgs(view, str_release);
        Py_XDECREF(released);
        PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        Py_DECREF(view);
        return -1;
    }
    Py_DECREF(r);
    PyObject *released = PyObject_CallMethodNoArgs(view, str_release);
    Py_DECREF(view);
    if (released == NULL) {
        return -1;
    }
    Py_DECREF(released);
    Partial *again = find_partial(self, session_id);
    if (again != NULL && again->buffer == buffer && again->length == 0 &&
        PyByteArray_GET_SIZE(buffer) > ASSEMBLER_KEEP_LIMIT) {
        Py_CLEAR(again->buffer);
    }
    return 0;
}

/* One fragment of a message that is not whole (flags without both begin and end). ``offset`` is the
 * frame's offset in its term; ``header_offset`` >= 0 repoints ``header`` there before the handler
 * sees it (read_term's inline path), -1 leaves it (the handler was given a header already). */
static int assemble(AssemblerCore *self, const char *payload, Py_ssize_t length, uint8_t flags, int32_t session_id,
                    Py_ssize_t offset, int64_t frame_length, PyObject *header, Py_ssize_t header_offset) {
    /* offset + ((frame_length + 31) & -32), as the reference computes it with Python ints: a caller's
     * header may hold any int64, so an overflow means no later fragment's offset can match it */
    int64_t aligned = 0;
    Py_ssize_t next_offset = 0;
    char next_reachable = !__builtin_add_overflow(frame_length, (int64_t)31, &aligned) &&
                          !__builtin_add_overflow(offset, (Py_ssize_t)(aligned & ~(int64_t)31), &next_offset);
    Partial *p = find_partial(self, session_id);
    if (flags & BEGIN_FLAG) {
        if (p == NULL && (p = add_partial(self, session_id)) == NULL) {
            return -1;
        }
        p->length = 0;
        if (reserve(p, length) < 0) {
            return -1;
        }
        memcpy(PyByteArray_AS_STRING(p->buffer), payload, (size_t)length);
        p->length = length;
        p->next_offset = next_offset;
        p->next_reachable = next_reachable;
        return 0;
    }
    if (p == NULL || p->length == 0 || !p->next_reachable || p->next_offset != offset) {
        if (p != NULL) {
            p->length = 0;
        }
        return 0;
    }
    if (length > PY_SSIZE_T_MAX - p->length) {
        p->length = 0;
        PyErr_NoMemory();
        return -1;
    }
    if (reserve(p, p->length + length) < 0) {
        p->length = 0;
        return -1;
    }
    memcpy(PyByteArray_AS_STRING(p->buffer) + p->length, payload, (size_t)length);
    p->length += length;
    if (!(flags & END_FLAG)) {
        p->next_offset = next_offset;
        p->next_reachable = next_reachable;
        return 0;
    }
    if (header_offset >= 0 && set_header_offset(header, header_offset) < 0) {
        p->length = 0;
        return -1;
    }
    return deliver(self, p, header);
}

static int int_attr(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* assembler(fragment, header): the same logic for a caller that is not read_term, reading the header's
 * fields through its properties. */
static PyObject *assembler_call(AssemblerCore *self, PyObject *args, PyObject *kwargs) {
    PyObject *fragment, *header;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "FragmentAssembler takes (fragment, header)");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "FragmentAssembler", 2, 2, &fragment, &header)) {
        return NULL;
    }
    if (self->handler == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FragmentAssembler was not initialised");
        return NULL;
    }
    long long flags, session_id, offset, frame_length;
    if (int_attr(header, str_flags, &flags) < 0) {
        return NULL;
    }
    if ((flags & UNFRAGMENTED) == UNFRAGMENTED) {
        /* the header's properties are Python: the handler is read after them, and held for its call */
        if (self->handler == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "FragmentAssembler was not initialised");
            return NULL;
        }
        PyObject *handler = Py_NewRef(self->handler);
        PyObject *call[2] = {fragment, header};
        PyObject *r = PyObject_Vectorcall(handler, call, 2, NULL);
        Py_DECREF(handler);
        return r;
    }
    if (int_attr(header, str_session_id, &session_id) < 0 || int_attr(header, str_offset, &offset) < 0 ||
        int_attr(header, str_frame_length, &frame_length) < 0) {
        return NULL;
    }
    Py_buffer fb;
    if (PyObject_GetBuffer(fragment, &fb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int r = assemble(self, (const char *)fb.buf, fb.len, (uint8_t)flags, (int32_t)session_id, (Py_ssize_t)offset,
                     frame_length, header, -1);
    PyBuffer_Release(&fb);
    if (r < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *assembler_free_session_buffer(AssemblerCore *self, PyObject *arg) {
    long session_id = PyLong_AsLong(arg);
    if (session_id == -1 && PyErr_Occurred()) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (self->partials[i].session_id == (int32_t)session_id) {
            Py_CLEAR(self->partials[i].buffer);
            self->partials[i] = self->partials[--self->count];
            break;
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef assembler_methods[] = {
    {"free_session_buffer", (PyCFunction)assembler_free_session_buffer, METH_O,
     "Forget a session's partial message (call from an unavailable-image handler)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot assembler_slots[] = {
    {Py_tp_doc, "FragmentAssembler's state and reassembly in C; read_term assembles inline for it."},
    {Py_tp_methods, assembler_methods},
    {Py_tp_call, assembler_call},
    {Py_tp_init, assembler_init},
    {Py_tp_traverse, assembler_traverse},
    {Py_tp_clear, assembler_clear},
    {Py_tp_dealloc, assembler_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec assembler_spec = {
    "slipstream.logbuffer._fastpath.AssemblerCore",
    sizeof(AssemblerCore),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    assembler_slots,
};

/* The assembler read_term may work for inline: our type, its call not overridden by a subclass. */
static AssemblerCore *inline_assembler(PyObject *handler) {
    if (assembler_type != NULL && PyObject_TypeCheck(handler, assembler_type) &&
        Py_TYPE(handler)->tp_call == (ternaryfunc)assembler_call && ((AssemblerCore *)handler)->handler != NULL) {
        return (AssemblerCore *)handler;
    }
    return NULL;
}

/* The header names the failing frame, as when a Python handler raises; the pending error is kept. */
static void repoint_after_error(PyObject *header, Py_ssize_t offset) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (set_header_offset(header, offset) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(type, value, traceback);
}

/* read_term(term, term_i32, offset, handler, fragment_limit, header) -> (fragments, next_offset, intact) */
/* The frames from ``*offset`` on, up to ``fragment_limit`` DATA frames, to ``handler`` (or assembled inline
 * by a FragmentAssembler); padding skipped. ``term`` is the object ``base``/``capacity`` were taken from,
 * and ``header.buffer`` must be it already. On return ``*offset`` is where reading stops, ``*fragments``
 * how many were delivered and ``*intact`` 0 when the frame there cannot be valid. -1: the handler (or
 * the assembly) raised, ``header.offset`` names that frame and ``*failed_end`` is just past it. */
static int read_frames(PyObject *term, const char *base, Py_ssize_t capacity, Py_ssize_t *offset_io,
                       PyObject *handler, long long fragment_limit, PyObject *header, long long *fragments_out,
                       int *intact_out, Py_ssize_t *failed_end) {
    Py_ssize_t offset = *offset_io;
    int fast = plain_byte_view(term);
    AssemblerCore *assembler = inline_assembler(handler);
    if (assembler != NULL) {
        handler = assembler->handler;
    }
    Py_INCREF(handler); /* held: an assembler's handler may be replaced while it runs */
    long long fragments = 0;
    int intact = 1;
    int failed = 0;
    while (fragments < fragment_limit && offset < capacity) {
        Py_ssize_t word = offset & ~(Py_ssize_t)3;
        if (word + 4 > capacity) {
            intact = 0;
            break;
        }
        int32_t frame_length = load_i32(base + word);
        if (frame_length <= 0) {
            break;
        }
        Py_ssize_t frame_offset = offset;
        if (frame_length < HEADER_LENGTH || frame_length > capacity - frame_offset) {
            intact = 0;
            break;
        }
        offset += ALIGN32((Py_ssize_t)frame_length);
        uint8_t frame_type = (uint8_t)base[frame_offset + TYPE_OFFSET];
        if (frame_type != HDR_TYPE_DATA) {
            if (frame_type == HDR_TYPE_PAD && base[frame_offset + TYPE_OFFSET + 1] == 0) {
                continue;
            }
            offset = frame_offset;
            intact = 0;
            break;
        }
        fragments++;
        *failed_end = offset;
        if (assembler != NULL) {
            uint8_t flags = (uint8_t)base[frame_offset + FLAGS_OFFSET];
            if ((flags & UNFRAGMENTED) != UNFRAGMENTED) {
                int32_t session_id;
                memcpy(&session_id, base + frame_offset + SESSION_ID_OFFSET, 4);
                if (assemble(assembler, base + frame_offset + HEADER_LENGTH, frame_length - HEADER_LENGTH, flags,
                             session_id, frame_offset, frame_length, header, frame_offset) < 0) {
                    /* the header names the failing frame, as when a Python handler raises */
                    repoint_after_error(header, frame_offset);
                    failed = 1;
                    break;
                }
                continue;
            }
        }
        if (set_header_offset(header, frame_offset) < 0) {
            failed = 1;
            break;
        }
        PyObject *call[2];
        call[0] = sub_view(term, fast, frame_offset + HEADER_LENGTH, frame_length - HEADER_LENGTH);
        if (call[0] == NULL) {
            failed = 1;
            break;
        }
        call[1] = header;
        PyObject *r = PyObject_Vectorcall(handler, call, 2, NULL);
        Py_DECREF(call[0]);
        if (r == NULL) {
            failed = 1;
            break;
        }
        Py_DECREF(r);
    }
    Py_DECREF(handler);
    *offset_io = offset;
    *fragments_out = fragments;
    *intact_out = intact;
    return failed ? -1 : 0;
}

/* read_term(term, term_i32, offset, handler, fragment_limit, header) -> (fragments, next_offset, intact) */
static PyObject *fp_read_term(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "read_term takes 6 arguments");
        return NULL;
    }
    PyObject *term = args[0], *handler = args[3], *header = args[5];
    Py_ssize_t offset = PyLong_AsSsize_t(args[2]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long fragment_limit = PyLong_AsLongLong(args[4]);
    if (fragment_limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "offset must not be negative");
        return NULL;
    }
    Py_buffer tb;
    if (PyObject_GetBuffer(term, &tb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (PyObject_SetAttr(header, str_buffer, term) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    long long fragments;
    int intact;
    Py_ssize_t failed_end = 0;
    int r = read_frames(term, (const char *)tb.buf, tb.len, &offset, handler, fragment_limit, header, &fragments,
                        &intact, &failed_end);
    PyBuffer_Release(&tb);
    if (r < 0) {
        return NULL;
    }
    return read_result(fragments, offset, intact);
}

/* ---- ImageCore --------------------------------------------------------------------------------- */

/* The subscriber side of an image: its position and terms, and ``poll`` in C (image.py's ``PyImage`` is
 * the reference). The Python subclass keeps everything else (mapping, parking, block_poll, release). */
typedef struct {
    PyObject_HEAD
    long long position;
    long long mask;
    long long bits;
    long long index;
    PyObject *terms;  /* tuple of the three term views */
    PyObject *values; /* the counters' int64 view; ``index`` is this subscriber's position in it */
    PyObject *header;
    char closed;
    char corrupt;
} ImageCore;

static int image_traverse(ImageCore *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->terms);
    Py_VISIT(self->values);
    Py_VISIT(self->header);
    return 0;
}

static int image_clear(ImageCore *self) {
    Py_CLEAR(self->terms);
    Py_CLEAR(self->values);
    Py_CLEAR(self->header);
    return 0;
}

static void image_dealloc(ImageCore *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    image_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Publish this subscriber's position (what lets the publisher move on). */
static int image_advance(ImageCore *self, long long position) {
    self->position = position;
    Py_buffer vb;
    if (PyObject_GetBuffer(self->values, &vb, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if (!i64_index_ok(self->index, vb.len)) {
        PyBuffer_Release(&vb);
        PyErr_SetString(PyExc_IndexError, "position counter outside its buffer");
        return -1;
    }
    store_i64_release((char *)vb.buf + self->index * 8, position);
    PyBuffer_Release(&vb);
    return 0;
}

/* Whether the image's terms and position are set up (what poll and has_frame index with). */
static int image_terms_ready(const ImageCore *self) {
    return self->terms != NULL && PyTuple_Check(self->terms) && PyTuple_GET_SIZE(self->terms) == 3 &&
           self->position >= 0 && self->bits >= 0 && self->bits <= 40;
}

/* poll(handler, fragment_limit) -> fragments: Image.poll. */
static PyObject *image_poll(ImageCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "poll(handler, fragment_limit)");
        return NULL;
    }
    long long fragment_limit = PyLong_AsLongLong(args[1]);
    if (fragment_limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (self->closed) {
        return PyLong_FromLong(0);
    }
    if (!image_terms_ready(self) || self->values == NULL || self->header == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "image not initialised");
        return NULL;
    }
    long long position = self->position;
    Py_ssize_t offset = (Py_ssize_t)(position & self->mask); /* >= 0: position is */
    /* held from here: getting its buffer or setting the header's may run Python, which may replace the
     * image's terms and header (and handlers may too) */
    PyObject *term = Py_NewRef(PyTuple_GET_ITEM(self->terms, (Py_ssize_t)((position >> self->bits) % 3)));
    Py_buffer tb;
    if (PyObject_GetBuffer(term, &tb, PyBUF_SIMPLE) < 0) {
        Py_DECREF(term);
        return NULL;
    }
    const char *base = (const char *)tb.buf;
    if (offset <= tb.len - 4 && (offset & 3) == 0 && load_i32(base + offset) <= 0) {
        PyBuffer_Release(&tb);
        Py_DECREF(term);
        return PyLong_FromLong(0); /* nothing new: the common case of a busy poll */
    }
    PyObject *header = self->header == NULL ? NULL : Py_NewRef(self->header);
    if (header == NULL || PyObject_SetAttr(header, str_buffer, term) < 0) {
        if (header == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "image not initialised");
        }
        Py_XDECREF(header);
        PyBuffer_Release(&tb);
        Py_DECREF(term);
        return NULL;
    }
    long long fragments = 0;
    int intact = 1;
    Py_ssize_t next_offset = offset, failed_end = offset;
    int r = read_frames(term, base, tb.len, &next_offset, args[0], fragment_limit, header, &fragments, &intact,
                        &failed_end);
    PyBuffer_Release(&tb);
    Py_DECREF(header);
    Py_DECREF(term);
    long long advanced;
    if (r < 0) {
        /* the fragments before and the failing one count as consumed (not delivered again) */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (__builtin_add_overflow(position, (long long)(failed_end - offset), &advanced) ||
            image_advance(self, advanced) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    if (next_offset != offset) {
        if (__builtin_add_overflow(position, (long long)(next_offset - offset), &advanced)) {
            PyErr_SetString(PyExc_OverflowError, "image position outside int64");
            return NULL;
        }
        if (image_advance(self, advanced) < 0) {
            return NULL;
        }
    }
    if (!intact) {
        self->corrupt = 1;
        self->closed = 1;
    }
    return PyLong_FromLongLong(fragments);
}

/* has_frame() -> bool: PyImage.has_frame, what a spinning poller asks between cycles (one length word read,
 * no Python call). False for a closed or uninitialised image, or a position outside its term. */
static PyObject *image_has_frame(ImageCore *self, PyObject *Py_UNUSED(ignored)) {
    if (self->closed || !image_terms_ready(self)) {
        Py_RETURN_FALSE;
    }
    long long position = self->position;
    Py_ssize_t offset = (Py_ssize_t)(position & self->mask);
    PyObject *term = Py_NewRef(PyTuple_GET_ITEM(self->terms, (Py_ssize_t)((position >> self->bits) % 3)));
    Py_buffer tb;
    if (PyObject_GetBuffer(term, &tb, PyBUF_SIMPLE) < 0) {
        Py_DECREF(term);
        return NULL;
    }
    int ready = offset >= 0 && offset <= tb.len - 4 && (offset & 3) == 0 && load_i32((const char *)tb.buf + offset) > 0;
    PyBuffer_Release(&tb);
    Py_DECREF(term);
    return PyBool_FromLong(ready);
}

static PyMethodDef image_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))image_poll, METH_FASTCALL,
     "poll(handler, fragment_limit) -> fragments delivered (see Image.poll)."},
    {"has_frame", (PyCFunction)image_has_frame, METH_NOARGS,
     "True when a complete frame waits at this subscriber's position (see PyImage.has_frame)."},
    {"_has_frame", (PyCFunction)image_has_frame, METH_NOARGS, "As has_frame (see PyImage._has_frame)."},
    {NULL, NULL, 0, NULL},
};

#define ILL(name, field) {name, T_LONGLONG, offsetof(ImageCore, field), 0, NULL}
#define IOBJ(name, field) {name, T_OBJECT_EX, offsetof(ImageCore, field), 0, NULL}
static PyMemberDef image_members[] = {
    ILL("_position", position),
    ILL("_mask", mask),
    ILL("_bits", bits),
    ILL("_index", index),
    IOBJ("_terms", terms),
    IOBJ("_values", values),
    IOBJ("_header", header),
    {"_closed", T_BOOL, offsetof(ImageCore, closed), 0, NULL},
    {"is_corrupt", T_BOOL, offsetof(ImageCore, corrupt), 0,
     "Set when the log held a frame that cannot be valid; the image then delivers nothing more."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot image_slots[] = {
    {Py_tp_doc, "An image's position, terms and poll in C; a Python subclass does the rest."},
    {Py_tp_methods, image_methods},
    {Py_tp_members, image_members},
    {Py_tp_traverse, image_traverse},
    {Py_tp_clear, image_clear},
    {Py_tp_dealloc, image_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec image_spec = {
    "slipstream.logbuffer._fastpath.ImageCore",
    sizeof(ImageCore),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    image_slots,
};

/* scan_block(term, term_i32, offset, max_length) -> (data_end, next_offset, intact); see reader.py. */
static PyObject *fp_scan_block(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan_block takes 4 arguments");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[2]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t max_length = PyLong_AsSsize_t(args[3]);
    if (max_length == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (offset < 0 || max_length < 0) {
        PyErr_SetString(PyExc_ValueError, "offset and max_length must not be negative");
        return NULL;
    }
    Py_buffer tb;
    if (PyObject_GetBuffer(args[0], &tb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const char *base = (const char *)tb.buf;
    Py_ssize_t capacity = tb.len;
    Py_ssize_t limit = max_length < capacity - offset ? offset + max_length : capacity;
    Py_ssize_t end = offset, next = -1;
    int intact = 1;
    while (end < limit) {
        Py_ssize_t word = end & ~(Py_ssize_t)3;
        if (word + 4 > capacity) {
            intact = 0;
            break;
        }
        int32_t frame_length = load_i32(base + word);
        if (frame_length <= 0) {
            break;
        }
        if (frame_length < HEADER_LENGTH || frame_length > capacity - end) {
            intact = 0;
            break;
        }
        Py_ssize_t aligned = ALIGN32((Py_ssize_t)frame_length);
        uint8_t frame_type = (uint8_t)base[end + TYPE_OFFSET];
        if (frame_type != HDR_TYPE_DATA) {
            if (frame_type == HDR_TYPE_PAD && base[end + TYPE_OFFSET + 1] == 0) {
                if (end == offset) {
                    next = end + aligned;
                }
                break;
            }
            intact = 0;
            break;
        }
        if (end + aligned > limit && end > offset) {
            break;
        }
        end += aligned;
    }
    PyBuffer_Release(&tb);
    return Py_BuildValue("(nnO)", end, next < 0 ? end : next, intact ? Py_True : Py_False);
}

/* ---- the driver's datagram paths --------------------------------------------------------------- */

static inline int32_t rd_i32(const char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t rd_u16(const char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* scan_equal_frames(data, result_type) -> result_type(session_id, stream_id, term_id, term_offset, flags,
 * False, frame_length, total) or None: the C twin of wire.frames.scan_equal_frames (a datagram, or a GRO
 * batch of them, that is one run of equal DATA frames of one stream and term at consecutive offsets). */
static PyObject *fp_scan_equal_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "scan_equal_frames(data, result_type): result_type must be a tuple type");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();  /* not a plain byte buffer: the Python path decides what it is */
        Py_RETURN_NONE;
    }
    const char *buf = (const char *)b.buf;
    Py_ssize_t total = b.len;
    int ok = 0;
    int32_t length = 0, term_offset = 0, session_id = 0, stream_id = 0, term_id = 0;
    uint8_t flags = 0;
    if (total >= HEADER_LENGTH && (total & 31) == 0) {
        length = rd_i32(buf);
        flags = (uint8_t)buf[5];
        term_offset = rd_i32(buf + 8);
        session_id = rd_i32(buf + 12);
        stream_id = rd_i32(buf + 16);
        term_id = rd_i32(buf + 20);
        if (rd_u16(buf + 6) == HDR_TYPE_DATA && buf[4] == 0 && length >= HEADER_LENGTH) {
            Py_ssize_t aligned = ALIGN32((Py_ssize_t)length);
            if (aligned == total) {
                ok = 1;
            } else if (aligned < total && total % aligned == 0) {
                ok = 1;
                int64_t expected_offset = term_offset;
                for (Py_ssize_t at = 0; at < total; at += aligned, expected_offset += aligned) {
                    const char *f = buf + at;
                    if (rd_i32(f) != length || f[4] != 0 || rd_u16(f + 6) != HDR_TYPE_DATA ||
                        rd_i32(f + 8) != expected_offset || rd_i32(f + 12) != session_id ||
                        rd_i32(f + 16) != stream_id || rd_i32(f + 20) != term_id) {
                        ok = 0;
                        break;
                    }
                }
            }
        }
    }
    PyBuffer_Release(&b);
    if (!ok) {
        Py_RETURN_NONE;
    }
    PyTypeObject *tp = (PyTypeObject *)args[1];
    PyObject *items[8];
    items[0] = PyLong_FromLong(session_id);
    items[1] = PyLong_FromLong(stream_id);
    items[2] = PyLong_FromLong(term_id);
    items[3] = PyLong_FromLong(term_offset);
    items[4] = PyLong_FromLong(flags);
    items[5] = Py_NewRef(Py_False);
    items[6] = PyLong_FromLong(length);
    items[7] = PyLong_FromSsize_t(total);
    PyObject *result = tp->tp_alloc(tp, 8);
    for (int i = 0; i < 8; i++) {
        if (items[i] == NULL || result == NULL) {
            for (int j = 0; j < 8; j++) {
                Py_XDECREF(items[j]);
            }
            Py_XDECREF(result);
            return NULL;
        }
    }
    for (int i = 0; i < 8; i++) {
        PyTuple_SET_ITEM(result, i, items[i]);
    }
    return result;
}

/* insert_datagram(term, term_offset, data, first_frame_length) -> bool: copy a validated datagram (or
 * run) into a term at ``term_offset`` unless its first slot is filled (a duplicate): everything but
 * the first frame's length word, then that word with a release store, so a reader never sees part. */
static PyObject *fp_insert_datagram(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "insert_datagram takes 4 arguments");
        return NULL;
    }
    Py_ssize_t term_offset = PyLong_AsSsize_t(args[1]);
    if (term_offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long first = PyLong_AsLong(args[3]);
    if (first == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (first < INT32_MIN || first > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "first_frame_length outside int32");
        return NULL;
    }
    Py_buffer tb, db;
    if (PyObject_GetBuffer(args[0], &tb, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &db, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    PyObject *result = NULL;
    if (term_offset < 0 || (term_offset & 3) || db.len < 4 || term_offset > tb.len - db.len) {
        PyErr_SetString(PyExc_ValueError, "datagram does not fit the term at that offset");
    } else {
        char *dst = (char *)tb.buf + term_offset;
        int inserted = load_i32(dst) == 0;
        if (inserted) {
            memcpy(dst + 4, (const char *)db.buf + 4, (size_t)(db.len - 4));
            store_i32_release(dst, (int32_t)first);
        }
        result = Py_NewRef(inserted ? Py_True : Py_False);
    }
    PyBuffer_Release(&db);
    PyBuffer_Release(&tb);
    return result;
}

/* The walk of reader.py's scan_term over ``capacity`` bytes at ``base``: whole frames from ``offset`` that fit
 * in ``max_length`` (``*available``), and if a PAD frame ends them, the part of it never sent (``*padding``). */
static void scan_term_core(const char *base, Py_ssize_t capacity, Py_ssize_t offset, long long max_length,
                           long long *available_out, long long *padding_out) {
    long long available = 0, padding = 0;
    while (offset + available < capacity) {
        Py_ssize_t frame_offset = offset + (Py_ssize_t)available;
        Py_ssize_t word = frame_offset & ~(Py_ssize_t)3;
        if (word + 4 > capacity || frame_offset + TYPE_OFFSET + 1 > capacity) {
            break;
        }
        int32_t frame_length = load_i32(base + word);
        if (frame_length <= 0 || frame_length > capacity - frame_offset) {
            break;
        }
        long long aligned = ALIGN32((long long)frame_length);
        if ((uint8_t)base[frame_offset + TYPE_OFFSET] == HDR_TYPE_PAD) {
            padding = aligned - HEADER_LENGTH;
            aligned = HEADER_LENGTH;
        }
        if (available + aligned > max_length) {
            padding = 0;
            break;
        }
        available += aligned;
        if (padding) {
            break;
        }
    }
    *available_out = available;
    *padding_out = padding;
}

/* scan_term(term, term_i32, offset, max_length) -> (available, padding): reader.py's scan_term (the
 * sender's cut of the log into datagrams), as the plain frame walk its run shortcut is equivalent to. */
static PyObject *fp_scan_term(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan_term takes 4 arguments");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[2]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long max_length = PyLong_AsLongLong(args[3]);
    if (max_length == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "offset must not be negative");
        return NULL;
    }
    Py_buffer tb;
    if (PyObject_GetBuffer(args[0], &tb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    long long available, padding;
    scan_term_core((const char *)tb.buf, tb.len, offset, max_length, &available, &padding);
    PyBuffer_Release(&tb);
    return Py_BuildValue("(LL)", available, padding);
}

/* cut_datagrams(term, offset, window, mtu, budget, out) -> (consumed, sent, limited): the sender's cut of
 * new data into datagrams (sender.py's _send_data loop, with scan_term per datagram), appending each
 * datagram to ``out`` as a slice of ``term`` (no copy: the bytes go to the socket as they lie in the
 * log). ``consumed`` counts skipped padding too, ``sent`` only the bytes handed out; ``limited`` is True
 * when the window was shut or a committed frame did not fit in what was left of it. */
static PyObject *fp_cut_datagrams(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6 || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "cut_datagrams(term, offset, window, mtu, budget, out: list)");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    long long window = offset == -1 && PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[2]);
    long long mtu = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[3]);
    long long budget = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "offset must not be negative");
        return NULL;
    }
    PyObject *term = args[0], *out = args[5];
    Py_buffer tb;
    if (PyObject_GetBuffer(term, &tb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const char *base = (const char *)tb.buf;
    Py_ssize_t capacity = tb.len;
    long long consumed = 0, sent = 0;
    int limited = window <= 0, failed = 0;
    for (long long i = 0; i < budget; i++) {
        if (window <= 0 || offset >= capacity) {
            break;
        }
        Py_ssize_t word = offset & ~(Py_ssize_t)3;
        if (word + 4 > capacity || load_i32(base + word) <= 0) {
            break;  /* nothing (more) committed here */
        }
        long long available, padding;
        scan_term_core(base, capacity, offset, window < mtu ? window : mtu, &available, &padding);
        if (available <= 0) {
            limited = 1;  /* a committed frame that does not fit in what is left of the window */
            break;
        }
        PyObject *datagram = PySequence_GetSlice(term, offset, offset + (Py_ssize_t)available);
        if (datagram == NULL || PyList_Append(out, datagram) < 0) {
            Py_XDECREF(datagram);
            failed = 1;
            break;
        }
        Py_DECREF(datagram);
        sent += available;
        long long step = available + padding;
        window -= step;
        offset += (Py_ssize_t)step;
        consumed += step;
        if (offset >= capacity) {
            break;
        }
    }
    PyBuffer_Release(&tb);
    if (failed) {
        return NULL;
    }
    return Py_BuildValue("(LLO)", consumed, sent, limited ? Py_True : Py_False);
}

/* is_equal_run(term, offset, frame_length, count) -> bool: reader.py's is_equal_run. Values beyond int64
 * give False, as the reference's ``offset + count * aligned > len(term)`` does for them (a negative
 * offset too: the reference would count it from the end, the sender never passes one). */
static PyObject *fp_is_equal_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "is_equal_run takes 4 arguments");
        return NULL;
    }
    int overflow_offset = 0, overflow_length = 0, overflow_count = 0;
    long long offset = PyLong_AsLongLongAndOverflow(args[1], &overflow_offset);
    long long frame_length = PyErr_Occurred() ? 0 : PyLong_AsLongLongAndOverflow(args[2], &overflow_length);
    long long count = PyErr_Occurred() ? 0 : PyLong_AsLongLongAndOverflow(args[3], &overflow_count);
    if (PyErr_Occurred()) {
        return NULL;
    }
    /* frame_length is checked before it is aligned (ALIGN32 of a value near INT64_MAX would overflow) */
    if (overflow_offset || overflow_length || overflow_count || count < 1 || offset < 0 ||
        frame_length < HEADER_LENGTH || frame_length > INT32_MAX) {
        Py_RETURN_FALSE;
    }
    long long aligned = ALIGN32(frame_length);
    Py_buffer tb;
    if (PyObject_GetBuffer(args[0], &tb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    /* offset + count * aligned <= len, in a form that cannot overflow for any offset and count */
    int equal = offset <= (long long)tb.len && count <= ((long long)tb.len - offset) / aligned;
    const char *base = (const char *)tb.buf;
    for (long long i = 0; equal && i < count; i++) {
        const char *f = base + offset + i * aligned;
        equal = rd_i32(f) == frame_length && rd_u16(f + TYPE_OFFSET) == HDR_TYPE_DATA;
    }
    PyBuffer_Release(&tb);
    return Py_NewRef(equal ? Py_True : Py_False);
}

/* ---- atomics on shared memory (Aeron's ring and broadcast buffers) ------------------------------- */

/* The word at ``offset`` of ``obj``'s buffer, ``width`` bytes (4 or 8), for an atomic operation: the buffer
 * must be writable when ``writable``, the word inside it and naturally aligned in memory (an atomic on a
 * misaligned address may tear, or fault on some CPUs). NULL with ValueError (or the buffer's error) set;
 * otherwise the caller releases ``b``. */
static char *atomic_word(PyObject *obj, PyObject *offset_obj, int width, int writable, Py_buffer *b) {
    int overflow = 0;
    long long offset = PyLong_AsLongLongAndOverflow(offset_obj, &overflow);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(obj, b, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (overflow || offset < 0 || offset > (long long)b->len - width) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "offset %lld: a %d-byte word there is outside the buffer", offset, width);
        return NULL;
    }
    char *p = (char *)b->buf + offset;
    if (((uintptr_t)p & (uintptr_t)(width - 1)) != 0) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "offset %lld: the word is not %d-byte aligned in memory", offset, width);
        return NULL;
    }
    return p;
}

/* A Python int as an int64 (OverflowError outside), or as an int32 when ``width`` is 4. */
static int atomic_value(PyObject *obj, int width, int64_t *out) {
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (width == 4 && (v < INT32_MIN || v > INT32_MAX)) {
        PyErr_SetString(PyExc_OverflowError, "value outside int32");
        return -1;
    }
    *out = v;
    return 0;
}

/* compare_and_set_i64(buffer, offset, expected, update) -> bool: a sequentially consistent CAS (Aeron's
 * claim of the ring buffer's tail by many writers in many processes). */
static PyObject *fp_compare_and_set_i64(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "compare_and_set_i64 takes 4 arguments");
        return NULL;
    }
    int64_t expected, update;
    if (atomic_value(args[2], 8, &expected) < 0 || atomic_value(args[3], 8, &update) < 0) {
        return NULL;
    }
    Py_buffer b;
    char *p = atomic_word(args[0], args[1], 8, 1, &b);
    if (p == NULL) {
        return NULL;
    }
    int swapped =
        __atomic_compare_exchange_n((int64_t *)p, &expected, update, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&b);
    return Py_NewRef(swapped ? Py_True : Py_False);
}

/* get_and_add_i64(buffer, offset, delta) -> the value before the add (Aeron's correlation counter). */
static PyObject *fp_get_and_add_i64(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "get_and_add_i64 takes 3 arguments");
        return NULL;
    }
    int64_t delta;
    if (atomic_value(args[2], 8, &delta) < 0) {
        return NULL;
    }
    Py_buffer b;
    char *p = atomic_word(args[0], args[1], 8, 1, &b);
    if (p == NULL) {
        return NULL;
    }
    /* wraps as Aeron's (two's complement) rather than invoking signed overflow */
    int64_t previous = (int64_t)__atomic_fetch_add((uint64_t *)p, (uint64_t)delta, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&b);
    return PyLong_FromLongLong(previous);
}

/* An acquire fence, then an acquire load: the loads made before it (a record just copied) are ordered before
 * it too, which Aeron's broadcast receiver needs when it checks the tail intent after a copy (it fences
 * first). Both compile to a plain load on x86-64. */
static PyObject *atomic_load(PyObject *const *args, Py_ssize_t nargs, int width, const char *usage) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_buffer b;
    const char *p = atomic_word(args[0], args[1], width, 0, &b);
    if (p == NULL) {
        return NULL;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    long long v = width == 8 ? (long long)__atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE)
                             : (long long)__atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&b);
    return PyLong_FromLongLong(v);
}

/* A release store, then a release fence: the stores after it are not seen before it either (Aeron's
 * broadcast tail intent needs that store-store order; both compile to a plain store on x86-64). */
static PyObject *atomic_store(PyObject *const *args, Py_ssize_t nargs, int width, const char *usage) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    int64_t v;
    if (atomic_value(args[2], width, &v) < 0) {
        return NULL;
    }
    Py_buffer b;
    char *p = atomic_word(args[0], args[1], width, 1, &b);
    if (p == NULL) {
        return NULL;
    }
    if (width == 8) {
        __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n((int32_t *)p, (int32_t)v, __ATOMIC_RELEASE);
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *fp_load_acquire_i64(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return atomic_load(args, nargs, 8, "load_acquire_i64 takes 2 arguments");
}

static PyObject *fp_load_acquire_i32(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return atomic_load(args, nargs, 4, "load_acquire_i32 takes 2 arguments");
}

static PyObject *fp_store_release_i64(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return atomic_store(args, nargs, 8, "store_release_i64 takes 3 arguments");
}

static PyObject *fp_store_release_i32(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return atomic_store(args, nargs, 4, "store_release_i32 takes 3 arguments");
}

/* ---- the driver's UDP send ---------------------------------------------------------------------- */

#ifdef __linux__
#define SEND_STACK 128
#define GSO_MAX_SEGMENTS 64 /* udp_channel.GSO_MAX_SEGMENTS (the kernel's UDP_MAX_SEGMENTS) */
#define GSO_MAX_BYTES 65000 /* udp_channel.GSO_MAX_BYTES */
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

#define GIL_HELD_BYTES 65536
/* Up to this many bytes a send (or, received so far, a receive) keeps the GIL: non-blocking system calls of
 * microseconds. Letting it go around each one costs the calling thread a switch interval (5 ms) to get it back
 * whenever another thread runs Python meanwhile, and a thread that lets it go on every message resets the
 * claim of a thread waiting for it (a poll thread woken for that message): a parked poller took UDP messages
 * from a computing thread up to 300 ms late so. A bulk transfer lets it go: there the other threads' work
 * alongside is worth more. */

/* send_datagrams(fd, datagrams, start, gso) -> (group_start, group_end, error) or None: udp_channel.UdpSocket.send
 * for a connected socket, from ``datagrams[start]`` on. Runs of equal size (a shorter last one allowed) go
 * in one sendmsg with UDP_SEGMENT when ``gso``, the rest one send each, as the Python code groups them;
 * up to GIL_HELD_BYTES the system calls run with the GIL held and never block (MSG_DONTWAIT), a bulk batch's
 * with it released (the datagrams' buffers are held meanwhile, so a view of a log stays valid). It stops at the
 * first failure: ``error`` is its errno (-1: a short send) and [group_start, group_end) the datagrams of that
 * call, for the caller's counters and GSO fallback; no failure gives (len, len, 0). None: a datagram is not a
 * plain byte buffer (the Python path sends it). */
static PyObject *fp_send_datagrams(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "send_datagrams(fd, datagrams: list, start, gso)");
        return NULL;
    }
    long fd_long = PyLong_AsLong(args[0]);
    Py_ssize_t start = fd_long == -1 && PyErr_Occurred() ? 0 : PyLong_AsSsize_t(args[2]);
    int gso = PyErr_Occurred() ? 0 : PyObject_IsTrue(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (fd_long > INT32_MAX) {
        fd_long = -1;
    }
    int fd = (int)fd_long;
    PyObject *list = args[1];
    Py_ssize_t total = PyList_GET_SIZE(list);
    if (start < 0 || start > total || fd < 0) {
        PyErr_SetString(PyExc_ValueError, "send_datagrams: start outside the list, or a negative fd");
        return NULL;
    }
    Py_ssize_t count = total - start;
    Py_buffer stack_bufs[SEND_STACK];
    struct iovec stack_iov[SEND_STACK];
    Py_buffer *bufs = stack_bufs;
    struct iovec *iov = stack_iov;
    if (count > SEND_STACK) {
        bufs = PyMem_New(Py_buffer, (size_t)count);
        iov = PyMem_New(struct iovec, (size_t)count);
        if (bufs == NULL || iov == NULL) {
            PyMem_Free(bufs);
            PyMem_Free(iov);
            return PyErr_NoMemory();
        }
    }
    Py_ssize_t got = 0;
    for (; got < count; got++) {
        /* Getting a buffer may run Python code (a __buffer__ method) that changes the list: each item is
         * held while its buffer is taken (the buffer then holds its exporter), and the list's length is
         * checked again before each read. A list that shrank is left to the Python path. */
        int usable = 0;
        if (start + got < PyList_GET_SIZE(list)) {
            PyObject *item = Py_NewRef(PyList_GET_ITEM(list, start + got));
            usable = payload_buffer(item, &bufs[got]);
            Py_DECREF(item);
        }
        if (usable != 1) {
            for (Py_ssize_t j = 0; j < got; j++) {
                PyBuffer_Release(&bufs[j]);
            }
            if (bufs != stack_bufs) {
                PyMem_Free(bufs);
                PyMem_Free(iov);
            }
            if (usable < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        iov[got].iov_base = bufs[got].buf;
        iov[got].iov_len = (size_t)bufs[got].len;
    }
    Py_ssize_t index = 0, end = 0;
    int error = 0;
    struct iovec merged[GSO_MAX_SEGMENTS];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control;
    size_t total_bytes = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        total_bytes += iov[k].iov_len;
    }
    /* A few datagrams go with the GIL held, never blocking (MSG_DONTWAIT: EAGAIN is the caller's, as from a
     * non-blocking socket): see GIL_HELD_BYTES. A bulk batch lets it go for its system calls. */
    int flags = total_bytes <= GIL_HELD_BYTES ? MSG_DONTWAIT : 0;
    PyThreadState *released = flags ? NULL : PyEval_SaveThread();
    while (index < count) {
        Py_ssize_t size = (Py_ssize_t)iov[index].iov_len;
        end = index + 1;
        if (gso) {
            Py_ssize_t per = GSO_MAX_BYTES / (size > 1 ? size : 1);
            Py_ssize_t limit = index + (per < GSO_MAX_SEGMENTS ? per : GSO_MAX_SEGMENTS);
            if (limit > count) {
                limit = count;
            }
            while (end < limit && (Py_ssize_t)iov[end].iov_len == size) {
                end++;
            }
            if (end < limit && (Py_ssize_t)iov[end].iov_len < size) {
                end++; /* GSO allows a shorter last segment */
            }
        }
        ssize_t r;
        if (end - index > 1) {
            struct msghdr msg;
            memset(&msg, 0, sizeof msg);
            memset(&control, 0, sizeof control);
            /* Datagrams cut from a log lie back to back: one iovec per contiguous range (the kernel
             * segments by UDP_SEGMENT, not by iovec), which saves it a copy loop per datagram. */
            Py_ssize_t used = 0;
            merged[0] = iov[index];
            for (Py_ssize_t k = index + 1; k < end; k++) {
                if ((char *)merged[used].iov_base + merged[used].iov_len == (char *)iov[k].iov_base) {
                    merged[used].iov_len += iov[k].iov_len;
                } else {
                    merged[++used] = iov[k];
                }
            }
            msg.msg_iov = merged;
            msg.msg_iovlen = (size_t)(used + 1);
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segment = (uint16_t)size;
            memcpy(CMSG_DATA(cm), &segment, sizeof segment);
            do {
                r = sendmsg(fd, &msg, flags);
            } while (r < 0 && errno == EINTR);
        } else {
            do {
                r = send(fd, iov[index].iov_base, iov[index].iov_len, flags);
            } while (r < 0 && errno == EINTR);
            if (r >= 0 && (size_t)r < iov[index].iov_len) {
                error = -1;
                break;
            }
        }
        if (r < 0) {
            error = errno;
            break;
        }
        index = end;
    }
    if (released != NULL) {
        PyEval_RestoreThread(released);
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        PyBuffer_Release(&bufs[j]);
    }
    if (bufs != stack_bufs) {
        PyMem_Free(bufs);
        PyMem_Free(iov);
    }
    if (error) {
        return Py_BuildValue("(nni)", start + index, start + end, error);
    }
    return Py_BuildValue("(nni)", start + count, start + count, 0);
}

#define RECV_SPACE 65536 /* udp_channel.MAX_DATAGRAM: what one receive call may fill */
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

/* The source of a datagram as socket.recvmsg_into gives it: (host, port) or (host, port, flowinfo, scope_id),
 * the host as getnameinfo(NI_NUMERICHOST) spells it, as CPython's socket module does. */
static PyObject *source_address(const struct sockaddr_storage *addr, socklen_t length) {
    char host[NI_MAXHOST];
    if (addr->ss_family == AF_INET && length >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        if (getnameinfo((const struct sockaddr *)addr, length, host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0) {
            Py_RETURN_NONE;
        }
        return Py_BuildValue("(si)", host, (int)ntohs(a->sin_port));
    }
    if (addr->ss_family == AF_INET6 && length >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        if (getnameinfo((const struct sockaddr *)addr, length, host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0) {
            Py_RETURN_NONE;
        }
        return Py_BuildValue("(siII)", host, (int)ntohs(a->sin6_port), (unsigned int)ntohl(a->sin6_flowinfo),
                             (unsigned int)a->sin6_scope_id);
    }
    Py_RETURN_NONE;
}

/* receive_batches(fd, buffer, budget, gro) -> [(start, end, segment, source), ...]: up to ``budget``
 * non-blocking receive calls into ``buffer`` (each into the next 64 KiB of it, while that much is left), the
 * GIL released only once more than GIL_HELD_BYTES came in; each entry is what one call received:
 * ``buffer[start:end]``, datagrams of ``segment`` bytes back to back but the last (GRO), from ``source``. Stops
 * at the first call that fails (nothing queued: EAGAIN; or an error such as ECONNREFUSED, which a receiver
 * ignores). */
static PyObject *fp_receive_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "receive_batches(fd, buffer, budget, gro)");
        return NULL;
    }
    long fd_long = PyLong_AsLong(args[0]);
    long budget = fd_long == -1 && PyErr_Occurred() ? 0 : PyLong_AsLong(args[2]);
    int gro = PyErr_Occurred() ? 0 : PyObject_IsTrue(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (fd_long < 0 || fd_long > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "receive_batches: bad fd");
        return NULL;
    }
    if (budget > 64) {
        budget = 64;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[1], &b, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    struct batch {
        Py_ssize_t start, size;
        int segment;
        socklen_t address_length;
        struct sockaddr_storage address;
    } batches[64];
    long calls = 0;
    Py_ssize_t used = 0;
    int fd = (int)fd_long;
    PyThreadState *released = NULL; /* the GIL held until GIL_HELD_BYTES came in (see there) */
    while (calls < budget && b.len - used >= RECV_SPACE) {
        if (released == NULL && used > GIL_HELD_BYTES) {
            released = PyEval_SaveThread();
        }
        struct batch *r = &batches[calls];
        struct iovec iov = {(char *)b.buf + used, RECV_SPACE};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } control;
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_name = &r->address;
        msg.msg_namelen = sizeof r->address;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (gro) {
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
        }
        ssize_t size;
        do {
            size = recvmsg(fd, &msg, MSG_DONTWAIT);
        } while (size < 0 && errno == EINTR);
        if (size < 0) {
            break;
        }
        r->start = used;
        r->size = size;
        r->segment = (int)size;
        r->address_length = msg.msg_namelen < sizeof r->address ? msg.msg_namelen : sizeof r->address;
        for (struct cmsghdr *cm = gro ? CMSG_FIRSTHDR(&msg) : NULL; cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO && cm->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int segment;
                memcpy(&segment, CMSG_DATA(cm), sizeof segment);
                /* as udp_channel: a zero or absurd size means one datagram of the whole size */
                r->segment = segment > 0 && segment < size ? segment : (int)size;
            }
        }
        used += size;
        calls++;
    }
    if (released != NULL) {
        PyEval_RestoreThread(released);
    }
    PyBuffer_Release(&b);
    PyObject *list = PyList_New(calls);
    if (list == NULL) {
        return NULL;
    }
    PyObject *source = NULL;
    for (long i = 0; i < calls; i++) {
        struct batch *r = &batches[i];
        if (source == NULL || r->address_length != batches[i - 1].address_length ||
            memcmp(&r->address, &batches[i - 1].address, r->address_length) != 0) {
            Py_XDECREF(source);
            source = source_address(&r->address, r->address_length);
            if (source == NULL) {
                Py_DECREF(list);
                return NULL;
            }
        }
        PyObject *item = Py_BuildValue("(nniO)", r->start, r->start + r->size, r->segment, source);
        if (item == NULL) {
            Py_DECREF(source);
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    Py_XDECREF(source);
    return list;
}

/* A file descriptor argument: its value, or -1 with ValueError (or the conversion's error) set. */
static int fd_argument(PyObject *arg, const char *what) {
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (fd < 0 || fd > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: bad fd %ld", what, fd);
        return -1;
    }
    return (int)fd;
}

/* send_ring(fd, address) -> errno: one byte sent from the UNIX datagram socket ``fd`` to ``address`` (the bytes of a
 * sun_path: a doorbell's abstract name), non-blocking (MSG_DONTWAIT); 0 when sent, else the errno (ECONNREFUSED or
 * ENOENT: nobody listens there; EAGAIN: its queue is full). The GIL stays held: a writer that rings on every append
 * and let it go each time would hand it back and forth so often that the thread it wakes, waiting for the GIL
 * too, might never get it (the release resets that thread's forced switch): a parked poller woken by a busy
 * writer waited up to a second so. */
static PyObject *fp_send_ring(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send_ring(fd, address)");
        return NULL;
    }
    int fd = fd_argument(args[0], "send_ring");
    char *name;
    Py_ssize_t length;
    if (fd < 0 || PyBytes_AsStringAndSize(args[1], &name, &length) < 0) {
        return NULL;
    }
    struct sockaddr_un address;
    if (length <= 0 || (size_t)length > sizeof address.sun_path) {
        PyErr_SetString(PyExc_ValueError, "send_ring: bad address");
        return NULL;
    }
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    memcpy(address.sun_path, name, (size_t)length);
    socklen_t address_length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)length);
    static const char ring_byte = 1;
    ssize_t sent;
    do {
        sent = sendto(fd, &ring_byte, 1, MSG_DONTWAIT, (const struct sockaddr *)&address, address_length);
    } while (sent < 0 && errno == EINTR);
    return PyLong_FromLong(sent < 0 ? errno : 0);
}

#define DRAIN_LIMIT 4096 /* reads at most per call: a flood of rings cannot hold the caller (and the GIL) long */

/* drain_datagrams(fd) -> count: read and drop the datagrams queued on socket ``fd`` (a doorbell's rings),
 * up to DRAIN_LIMIT, stopping at the first read that finds none (or fails). Each read is non-blocking
 * (MSG_DONTWAIT) and takes about a microsecond, so the GIL stays held: released around each one, a thread
 * woken by the rings would wait up to a switch interval to get it back, per read, while another thread
 * runs Python. */
static PyObject *fp_drain_datagrams(PyObject *module, PyObject *arg) {
    (void)module;
    int fd = fd_argument(arg, "drain_datagrams");
    if (fd < 0) {
        return NULL;
    }
    char scratch[64];
    long count = 0;
    while (count < DRAIN_LIMIT) {
        ssize_t size = recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
        if (size < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        count++;
    }
    return PyLong_FromLong(count);
}
#endif

static PyMethodDef module_methods[] = {
    {"read_term", (PyCFunction)(void (*)(void))fp_read_term, METH_FASTCALL,
     "read_term(term, term_i32, offset, handler, fragment_limit, header) -> (fragments, next_offset, intact)"},
    {"scan_block", (PyCFunction)(void (*)(void))fp_scan_block, METH_FASTCALL,
     "scan_block(term, term_i32, offset, max_length) -> (data_end, next_offset, intact)"},
    {"scan_term", (PyCFunction)(void (*)(void))fp_scan_term, METH_FASTCALL,
     "scan_term(term, term_i32, offset, max_length) -> (available, padding)"},
    {"is_equal_run", (PyCFunction)(void (*)(void))fp_is_equal_run, METH_FASTCALL,
     "is_equal_run(term, offset, frame_length, count) -> bool"},
    {"scan_equal_frames", (PyCFunction)(void (*)(void))fp_scan_equal_frames, METH_FASTCALL,
     "scan_equal_frames(data, result_type) -> result_type(...) or None (wire.frames.scan_equal_frames in C)"},
    {"insert_datagram", (PyCFunction)(void (*)(void))fp_insert_datagram, METH_FASTCALL,
     "insert_datagram(term, term_offset, data, first_frame_length) -> inserted"},
    {"cut_datagrams", (PyCFunction)(void (*)(void))fp_cut_datagrams, METH_FASTCALL,
     "cut_datagrams(term, offset, window, mtu, budget, out) -> (consumed, sent, limited)"},
    {"compare_and_set_i64", (PyCFunction)(void (*)(void))fp_compare_and_set_i64, METH_FASTCALL,
     "compare_and_set_i64(buffer, offset, expected, update) -> swapped"},
    {"get_and_add_i64", (PyCFunction)(void (*)(void))fp_get_and_add_i64, METH_FASTCALL,
     "get_and_add_i64(buffer, offset, delta) -> previous value"},
    {"load_acquire_i64", (PyCFunction)(void (*)(void))fp_load_acquire_i64, METH_FASTCALL,
     "load_acquire_i64(buffer, offset) -> value"},
    {"load_acquire_i32", (PyCFunction)(void (*)(void))fp_load_acquire_i32, METH_FASTCALL,
     "load_acquire_i32(buffer, offset) -> value"},
    {"store_release_i64", (PyCFunction)(void (*)(void))fp_store_release_i64, METH_FASTCALL,
     "store_release_i64(buffer, offset, value) -> None"},
    {"store_release_i32", (PyCFunction)(void (*)(void))fp_store_release_i32, METH_FASTCALL,
     "store_release_i32(buffer, offset, value) -> None"},
#ifdef __linux__
    {"send_datagrams", (PyCFunction)(void (*)(void))fp_send_datagrams, METH_FASTCALL,
     "send_datagrams(fd, datagrams, start, gso) -> (group_start, group_end, error) or None"},
    {"receive_batches", (PyCFunction)(void (*)(void))fp_receive_batches, METH_FASTCALL,
     "receive_batches(fd, buffer, budget, gro) -> [(start, end, segment, source), ...]"},
    {"send_ring", (PyCFunction)(void (*)(void))fp_send_ring, METH_FASTCALL,
     "send_ring(fd, address) -> errno (0: sent): one byte to a UNIX datagram address, non-blocking, the GIL held"},
    {"drain_datagrams", (PyCFunction)fp_drain_datagrams, METH_O,
     "drain_datagrams(fd) -> count: the datagrams queued on fd read and dropped, the GIL held"},
#endif
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m) {
#define INTERN(var, s)                                                                                                 \
    if ((var) == NULL && ((var) = PyUnicode_InternFromString(s)) == NULL) return -1
    INTERN(str_py_offer, "_py_offer");
    INTERN(str_py_claim, "_py_claim");
    INTERN(str_wrap, "_wrap");
    INTERN(str_offset, "offset");
    INTERN(str_buffer, "buffer");
    INTERN(str_clean_ahead, "_clean_ahead");
    INTERN(str_release, "release");
    INTERN(str_flags, "flags");
    INTERN(str_session_id, "session_id");
    INTERN(str_frame_length, "frame_length");
#undef INTERN
    PyObject *core = PyType_FromModuleAndSpec(m, &core_spec, NULL);
    if (core == NULL) {
        return -1;
    }
    if (PyModule_AddObject(m, "AppenderCore", core) < 0) {
        Py_DECREF(core);
        return -1;
    }
    PyObject *assembler = PyType_FromModuleAndSpec(m, &assembler_spec, NULL);
    if (assembler == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(m, "AssemblerCore", assembler) < 0) {
        Py_DECREF(assembler);
        return -1;
    }
    Py_XSETREF(assembler_type, (PyTypeObject *)assembler);
    PyObject *image = PyType_FromModuleAndSpec(m, &image_spec, NULL);
    if (image == NULL) {
        return -1;
    }
    if (PyModule_AddObject(m, "ImageCore", image) < 0) {
        Py_DECREF(image);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "slipstream.logbuffer._fastpath",
    "The log buffer's hot loops in C; the pure-Python modules are the reference and the fallback.",
    0,
    module_methods,
    module_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModuleDef_Init(&module_def); }
