/* slipstream.network._records: a connection's per-message steps in C (the record layer and the record
 * decoder), so a message does not pay CPython's eval loop for their bookkeeping.
 *
 * session.py's ``PyRecordLayer`` and serialization.py's ``Serialization.py_decode_record`` are the
 * reference: the same records, plaintexts, counters, frames and errors (tests/test_network_records_c.py
 * checks it, hostile inputs included). The cryptography is not here: sealing and opening call the
 * ``cryptography`` package's ChaCha20Poly1305 methods the Python side hands over; this module only frames
 * their input and output (the counter, its nonce, the replay window) and walks the plaintext.
 *
 * Safety: every length read from a record is checked against the bytes the record's buffer exports before
 * anything is sliced or allocated; the frame walk runs to the end (or its first error) before any value is
 * built, and caps the number of frames.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define COUNTER_SIZE 8
#define TAG_SIZE 16
#define RECORD_OVERHEAD (COUNTER_SIZE + TAG_SIZE)
#define LAST_COUNTER (UINT64_MAX - 1) /* 2**64 - 2: a sealer stops there, so 2**64 - 1 is never a record's */
#define FRAME_OVERHEAD 9
#define NO_COUNTER UINT64_MAX

/* What bind() hands over once: the exception classes and the frame tables (see session.py). */
static PyObject *err_malformed, *err_replayed, *err_tampered, *err_exhausted, *err_invalid_tag;
static PyObject *err_frame, *err_decode;
static PyObject *kind_of;    /* tuple of 256: FrameKind member, or None for an unknown kind byte */
static PyObject *is_message; /* tuple of 256 bools: MESSAGE and SYNC_REQUEST */
static PyObject *str_release;

static inline uint64_t load_be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline uint32_t load_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void store_be64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

static int bound(void) {
    if (err_malformed == NULL || err_frame == NULL || kind_of == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "slipstream.network._records: bind() was not called");
        return 0;
    }
    return 1;
}

/* bind(malformed, replayed, tampered, exhausted, invalid_tag, frame_error, decode_error, kind_of, is_message) */
static PyObject *rc_bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "bind() takes 9 arguments");
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if (!PyType_Check(args[i]) || !PyType_IsSubtype((PyTypeObject *)args[i], (PyTypeObject *)PyExc_Exception)) {
            PyErr_SetString(PyExc_TypeError, "bind(): the first 7 arguments must be exception classes");
            return NULL;
        }
    }
    if (!PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != 256 || !PyTuple_Check(args[8]) ||
        PyTuple_GET_SIZE(args[8]) != 256) {
        PyErr_SetString(PyExc_TypeError, "bind(): kind_of and is_message must be tuples of 256");
        return NULL;
    }
    Py_XSETREF(err_malformed, Py_NewRef(args[0]));
    Py_XSETREF(err_replayed, Py_NewRef(args[1]));
    Py_XSETREF(err_tampered, Py_NewRef(args[2]));
    Py_XSETREF(err_exhausted, Py_NewRef(args[3]));
    Py_XSETREF(err_invalid_tag, Py_NewRef(args[4]));
    Py_XSETREF(err_frame, Py_NewRef(args[5]));
    Py_XSETREF(err_decode, Py_NewRef(args[6]));
    Py_XSETREF(kind_of, Py_NewRef(args[7]));
    Py_XSETREF(is_message, Py_NewRef(args[8]));
    Py_RETURN_NONE;
}

/* ---- RecordCore ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    unsigned long long send_counter;
    unsigned long long highest;    /* highest counter accepted (NO_COUNTER: none yet) */
    unsigned long long lowest_ok;  /* counters below this are older than the window */
    unsigned long long *seen;      /* ring: the last counter accepted in each slot (NO_COUNTER: none) */
    long long window;
    long long max_record;
    long long seal_into_from;
    long long records_sealed, records_opened, rejected_malformed, rejected_tampered, rejected_replayed;
    PyObject *encrypt, *encrypt_into, *decrypt;
} RecordCore;

static int core_traverse(RecordCore *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->encrypt);
    Py_VISIT(self->encrypt_into);
    Py_VISIT(self->decrypt);
    return 0;
}

static int core_clear(RecordCore *self) {
    Py_CLEAR(self->encrypt);
    Py_CLEAR(self->encrypt_into);
    Py_CLEAR(self->decrypt);
    return 0;
}

static void core_dealloc(RecordCore *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    core_clear(self);
    PyMem_Free(self->seen);
    self->seen = NULL;
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* __init__(encrypt, encrypt_into, decrypt, replay_window, max_record, seal_into_from): the Python subclass
 * checks the keys and bounds first (the reference's messages); this only checks what would break it. */
static int core_init(RecordCore *self, PyObject *args, PyObject *kwargs) {
    PyObject *encrypt, *encrypt_into, *decrypt;
    long long window, max_record, seal_into_from;
    static char *names[] = {"encrypt", "encrypt_into", "decrypt", "replay_window", "max_record", "seal_into_from",
                            NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOLLL", names, &encrypt, &encrypt_into, &decrypt, &window,
                                     &max_record, &seal_into_from)) {
        return -1;
    }
    if (window < 1 || window > (1 << 20) || max_record < RECORD_OVERHEAD) {
        PyErr_SetString(PyExc_ValueError, "replay_window must be 1..2**20 and max_record at least 24");
        return -1;
    }
    if (!PyCallable_Check(encrypt) || !PyCallable_Check(encrypt_into) || !PyCallable_Check(decrypt)) {
        PyErr_SetString(PyExc_TypeError, "encrypt, encrypt_into and decrypt must be callable");
        return -1;
    }
    if (self->seen != NULL) { /* a second __init__ would free the window under an open() in progress */
        PyErr_SetString(PyExc_RuntimeError, "a record layer is initialised once");
        return -1;
    }
    unsigned long long *seen = PyMem_Malloc((size_t)window * sizeof(unsigned long long));
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (long long i = 0; i < window; i++) {
        seen[i] = NO_COUNTER;
    }
    self->seen = seen;
    self->window = window;
    self->max_record = max_record;
    self->seal_into_from = seal_into_from;
    self->send_counter = 0;
    self->highest = NO_COUNTER;
    self->lowest_ok = 0;
    self->records_sealed = self->records_opened = 0;
    self->rejected_malformed = self->rejected_tampered = self->rejected_replayed = 0;
    Py_XSETREF(self->encrypt, Py_NewRef(encrypt));
    Py_XSETREF(self->encrypt_into, Py_NewRef(encrypt_into));
    Py_XSETREF(self->decrypt, Py_NewRef(decrypt));
    return 0;
}

static int core_ready(RecordCore *self) {
    if (self->seen == NULL || self->encrypt == NULL || self->decrypt == NULL || self->encrypt_into == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "record layer not initialised");
        return 0;
    }
    return bound();
}

/* The 12-byte nonce of a counter: four zero bytes, then the counter big-endian. */
static PyObject *nonce_of(uint64_t counter) {
    unsigned char nonce[12] = {0};
    store_be64(nonce + 4, counter);
    return PyBytes_FromStringAndSize((const char *)nonce, 12);
}

/* seal(plaintext) -> record: PyRecordLayer.seal. */
static PyObject *core_seal(RecordCore *self, PyObject *plaintext) {
    if (!core_ready(self)) {
        return NULL;
    }
    uint64_t counter = self->send_counter;
    if (counter > LAST_COUNTER) {
        PyErr_SetString(err_exhausted, "the session's record counter is exhausted; a new handshake is needed");
        return NULL;
    }
    Py_ssize_t size = PyObject_Length(plaintext);
    if (size < 0) {
        return NULL;
    }
    self->send_counter = counter + 1; /* spent before encrypting: a nonce is never used twice */
    self->records_sealed++;
    PyObject *nonce = nonce_of(counter);
    if (nonce == NULL) {
        return NULL;
    }
    if (size < self->seal_into_from) {
        PyObject *call[3] = {nonce, plaintext, Py_None};
        PyObject *sealed = PyObject_Vectorcall(self->encrypt, call, 3, NULL);
        Py_DECREF(nonce);
        if (sealed == NULL) {
            return NULL;
        }
        if (!PyBytes_Check(sealed)) {
            Py_DECREF(sealed);
            PyErr_SetString(PyExc_TypeError, "encrypt did not return bytes");
            return NULL;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(sealed);
        PyObject *record = PyBytes_FromStringAndSize(NULL, COUNTER_SIZE + n);
        if (record != NULL) {
            unsigned char *out = (unsigned char *)PyBytes_AS_STRING(record);
            store_be64(out, counter);
            memcpy(out + COUNTER_SIZE, PyBytes_AS_STRING(sealed), (size_t)n);
        }
        Py_DECREF(sealed);
        return record;
    }
    /* a large record is encrypted in place, into its own buffer: no second copy */
    PyObject *record = PyByteArray_FromStringAndSize(NULL, RECORD_OVERHEAD + size);
    if (record == NULL) {
        Py_DECREF(nonce);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(record);
    store_be64(out, counter);
    PyObject *whole = PyMemoryView_FromObject(record);
    PyObject *into = whole == NULL ? NULL : PySequence_GetSlice(whole, COUNTER_SIZE, RECORD_OVERHEAD + size);
    Py_XDECREF(whole);
    if (into == NULL) {
        Py_DECREF(nonce);
        Py_DECREF(record);
        return NULL;
    }
    PyObject *call[4] = {nonce, plaintext, Py_None, into};
    PyObject *done = PyObject_Vectorcall(self->encrypt_into, call, 4, NULL);
    Py_DECREF(nonce);
    PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
    if (done == NULL) {
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb); /* (no call with an error set) */
    }
    PyObject *released = PyObject_CallMethodNoArgs(into, str_release); /* the bytearray may be resized again */
    Py_DECREF(into);
    if (done == NULL) {
        Py_XDECREF(released);
        PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
        Py_DECREF(record);
        return NULL;
    }
    Py_DECREF(done);
    if (released == NULL) {
        Py_DECREF(record);
        return NULL;
    }
    Py_DECREF(released);
    return record;
}

/* open(record) -> plaintext: PyRecordLayer.open. */
static PyObject *core_open(RecordCore *self, PyObject *record) {
    if (!core_ready(self)) {
        return NULL;
    }
    Py_buffer rb;
    if (PyObject_GetBuffer(record, &rb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Py_ssize_t size = rb.len;
    if (size < RECORD_OVERHEAD || size > self->max_record) {
        PyBuffer_Release(&rb);
        self->rejected_malformed++;
        PyErr_Format(err_malformed, "a record of %zd bytes (must be %d..%lld)", size, RECORD_OVERHEAD,
                     self->max_record);
        return NULL;
    }
    const unsigned char *bytes = (const unsigned char *)rb.buf;
    uint64_t counter = load_be64(bytes);
    if (counter > LAST_COUNTER) {
        PyBuffer_Release(&rb);
        self->rejected_malformed++;
        PyErr_Format(err_malformed, "record counter %llu is past the last one a sealer uses",
                     (unsigned long long)counter);
        return NULL;
    }
    if (counter < self->lowest_ok) {
        PyBuffer_Release(&rb);
        self->rejected_replayed++;
        PyErr_Format(err_replayed, "record %llu is older than the replay window (highest %llu)",
                     (unsigned long long)counter, self->highest);
        return NULL;
    }
    Py_ssize_t slot = (Py_ssize_t)(counter % (uint64_t)self->window);
    if (self->seen[slot] == counter) {
        PyBuffer_Release(&rb);
        self->rejected_replayed++;
        PyErr_Format(err_replayed, "record %llu was already received", (unsigned long long)counter);
        return NULL;
    }
    PyObject *nonce = nonce_of(counter);
    /* the sealed part, read in place (a view of the log, often): valid while rb is held */
    PyObject *sealed = nonce == NULL ? NULL
                                     : PyMemoryView_FromMemory((char *)rb.buf + COUNTER_SIZE, size - COUNTER_SIZE,
                                                               PyBUF_READ);
    if (sealed == NULL) {
        Py_XDECREF(nonce);
        PyBuffer_Release(&rb);
        return NULL;
    }
    PyObject *call[3] = {nonce, sealed, Py_None};
    PyObject *plaintext = PyObject_Vectorcall(self->decrypt, call, 3, NULL);
    Py_DECREF(nonce);
    if (Py_REFCNT(sealed) > 1) { /* kept by someone: it must not outlive the record's buffer */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        PyObject *released = PyObject_CallMethodNoArgs(sealed, str_release);
        Py_XDECREF(released);
        if (released == NULL) {
            PyErr_Clear();
        }
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    Py_DECREF(sealed);
    PyBuffer_Release(&rb);
    if (plaintext == NULL) {
        if (PyErr_ExceptionMatches(err_invalid_tag)) {
            PyErr_Clear();
            self->rejected_tampered++;
            PyErr_Format(err_tampered, "record %llu failed authentication", (unsigned long long)counter);
        }
        return NULL;
    }
    self->seen[slot] = counter;
    if (self->highest == NO_COUNTER || counter > self->highest) {
        self->highest = counter;
        self->lowest_ok = counter >= (uint64_t)self->window ? counter - (uint64_t)self->window + 1 : 0;
    }
    self->records_opened++;
    return plaintext;
}

static PyMethodDef core_methods[] = {
    {"seal", (PyCFunction)core_seal, METH_O, "One record carrying the plaintext (see PyRecordLayer.seal)."},
    {"open", (PyCFunction)core_open, METH_O, "The plaintext of a record (see PyRecordLayer.open)."},
    {NULL, NULL, 0, NULL},
};

#define CLL(name, field, doc) {name, T_LONGLONG, offsetof(RecordCore, field), READONLY, doc}
static PyMemberDef core_members[] = {
    {"_send_counter", T_ULONGLONG, offsetof(RecordCore, send_counter), 0, NULL},
    {"replay_window", T_LONGLONG, offsetof(RecordCore, window), READONLY, NULL},
    {"max_record", T_LONGLONG, offsetof(RecordCore, max_record), READONLY, NULL},
    CLL("records_sealed", records_sealed, "Records sealed (sent)."),
    CLL("records_opened", records_opened, "Records that verified and were accepted."),
    CLL("rejected_malformed", rejected_malformed, "Records too short or too long, or past the last counter."),
    CLL("rejected_tampered", rejected_tampered, "Records whose tag did not verify (altered, forged, other key)."),
    CLL("rejected_replayed", rejected_replayed, "Records already accepted, or older than the window."),
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_doc, "A record layer's counters, replay window, seal and open in C; a Python subclass does the rest."},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {Py_tp_init, core_init},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_clear},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec core_spec = {
    "slipstream.network._records.RecordCore",
    sizeof(RecordCore),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    core_slots,
};

/* ---- decode_record --------------------------------------------------------------------------------- */

/* A MessageDecodeError for a message frame that did not decode: why(frame payload, exc) names the
 * failure, exc becomes its __cause__. Takes the raised exception (set on entry); NULL when it is not an
 * Exception (KeyboardInterrupt and the like propagate) or why itself failed. */
static PyObject *decode_failure(PyObject *why, PyObject *decode_error, const unsigned char *payload,
                                Py_ssize_t length) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return NULL;
    }
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyErr_NormalizeException(&exc_type, &exc_value, &exc_tb);
    if (exc_tb != NULL && exc_value != NULL) {
        PyException_SetTraceback(exc_value, exc_tb);
    }
    Py_XDECREF(exc_type);
    Py_XDECREF(exc_tb);
    PyObject *data = PyBytes_FromStringAndSize((const char *)payload, length);
    PyObject *text = NULL, *error = NULL;
    if (data != NULL && exc_value != NULL) {
        PyObject *call[2] = {data, exc_value};
        text = PyObject_Vectorcall(why, call, 2, NULL);
    }
    if (text != NULL) {
        error = PyObject_CallOneArg(decode_error, text);
    }
    if (error != NULL && exc_value != NULL) {
        PyException_SetCause(error, exc_value); /* steals the reference */
        exc_value = NULL;
    }
    Py_XDECREF(exc_value);
    Py_XDECREF(data);
    Py_XDECREF(text);
    return error;
}

/* decode_record(record, max_frames, decode_fns, why) -> [(kind, request_id, value), ...]:
 * Serialization.py_decode_record, walk_frames' checks and messages included. */
static PyObject *rc_decode_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_record(record, max_frames, decode_fns, why)");
        return NULL;
    }
    if (!bound()) {
        return NULL;
    }
    Py_ssize_t max_frames = PyLong_AsSsize_t(args[1]);
    if (max_frames == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *fns = PySequence_Fast(args[2], "decode_fns must be a sequence");
    if (fns == NULL) {
        return NULL;
    }
    PyObject *why = args[3];
    Py_buffer rb;
    if (PyObject_GetBuffer(args[0], &rb, PyBUF_SIMPLE) < 0) {
        Py_DECREF(fns);
        return NULL;
    }
    /* held for the call: a decoder runs Python, which could bind() other tables meanwhile */
    PyObject *kinds = Py_NewRef(kind_of), *messages = Py_NewRef(is_message), *decode_error = Py_NewRef(err_decode);
    const unsigned char *buf = (const unsigned char *)rb.buf;
    Py_ssize_t end = rb.len, offset = 0, count = 0;
    uint32_t length = 0;
    PyObject *out = NULL;
    /* The walk first, to the end: each length checked against the bytes left, nothing built yet. */
    while (offset < end) {
        if (count >= max_frames) {
            PyErr_Format(err_frame, "more than %zd frames in one record", max_frames);
            goto done;
        }
        if (end - offset < FRAME_OVERHEAD) {
            PyErr_Format(err_frame, "truncated frame header: %zd bytes left at offset %zd", end - offset, offset);
            goto done;
        }
        unsigned int kind = buf[offset];
        if (PyTuple_GET_ITEM(kinds, kind) == Py_None) {
            PyErr_Format(err_frame, "unknown frame kind %u at offset %zd", kind, offset);
            goto done;
        }
        length = load_be32(buf + offset + 5);
        offset += FRAME_OVERHEAD + (Py_ssize_t)length;
        count++;
    }
    if (offset > end) { /* only the last frame can overrun: the walk stops at the first that does */
        Py_ssize_t start = offset - (Py_ssize_t)length;
        PyErr_Format(err_frame, "frame length %u at offset %zd exceeds the %zd bytes left", length,
                     start - FRAME_OVERHEAD, end - start);
        goto done;
    }
    out = PyList_New(count);
    if (out == NULL) {
        goto done;
    }
    offset = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned int kind = buf[offset];
        uint32_t request_id = load_be32(buf + offset + 1);
        Py_ssize_t start = offset + FRAME_OVERHEAD;
        Py_ssize_t stop = start + (Py_ssize_t)load_be32(buf + offset + 5);
        offset = stop;
        PyObject *value;
        if (PyTuple_GET_ITEM(messages, kind) == Py_True) {
            if (stop == start) {
                PyObject *text = PyUnicode_FromString("empty message");
                value = text == NULL ? NULL : PyObject_CallOneArg(decode_error, text);
                Py_XDECREF(text);
            } else {
                unsigned int first = buf[start];
                Py_ssize_t type_id, body;
                if (first < 128) {
                    type_id = first;
                    body = start + 1;
                } else {
                    /* the second byte of the id (the reference reads it even past a one-byte frame) */
                    type_id = start + 1 < end ? (Py_ssize_t)(((first & 0x7F) << 8) | buf[start + 1]) : -1;
                    body = start + 2;
                }
                /* the size read at each use, the decoder held through its call: a decoder (a type's
                 * __post_init__) runs Python, which could change the list */
                if (type_id < 0 || type_id >= PySequence_Fast_GET_SIZE(fns)) {
                    PyErr_SetString(PyExc_IndexError, type_id < 0 ? "index out of range" : "list index out of range");
                    value = NULL;
                } else { /* (a one-byte frame with a two-byte id: an empty body, as the reference's slice) */
                    PyObject *fn = Py_NewRef(PySequence_Fast_GET_ITEM(fns, type_id));
                    Py_ssize_t size = body > stop ? 0 : stop - body;
                    PyObject *data = PyBytes_FromStringAndSize((const char *)buf + body, size);
                    value = data == NULL ? NULL : PyObject_CallOneArg(fn, data);
                    Py_XDECREF(data);
                    Py_DECREF(fn);
                }
                if (value == NULL) {
                    value = decode_failure(why, decode_error, buf + start, stop - start);
                }
            }
        } else {
            value = PyBytes_FromStringAndSize((const char *)buf + start, stop - start);
        }
        if (value == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyObject *rid = PyLong_FromUnsignedLong(request_id);
        if (rid == NULL) {
            Py_DECREF(value);
            Py_CLEAR(out);
            goto done;
        }
        PyObject *item = PyTuple_New(3);
        if (item == NULL) {
            Py_DECREF(rid);
            Py_DECREF(value);
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(item, 0, Py_NewRef(PyTuple_GET_ITEM(kinds, kind)));
        PyTuple_SET_ITEM(item, 1, rid);
        PyTuple_SET_ITEM(item, 2, value);
        PyList_SET_ITEM(out, i, item);
    }
done:
    PyBuffer_Release(&rb);
    Py_DECREF(kinds);
    Py_DECREF(messages);
    Py_DECREF(decode_error);
    Py_DECREF(fns);
    return out;
}

/* ---- encode_frame_into ------------------------------------------------------------------------------ */

/* encode_frame_into(buf, kind, request_id, obj, frame_starts, encode_into) -> size, or -1 (buf as it was):
 * Serialization.py_encode_frame_into's sunny path. Anything it would raise (an unregistered type, a value
 * the encoder refuses, a kind or id out of range) is -1 here with no error set: the caller runs the
 * reference, which raises it with its message. */
static PyObject *rc_encode_frame_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6 || !PyByteArray_Check(args[0]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "encode_frame_into(buf: bytearray, kind, request_id, obj, frame_starts: dict, "
                                         "encode_into)");
        return NULL;
    }
    if (!bound()) {
        return NULL;
    }
    PyObject *buf = args[0];
    long kind = PyLong_AsLong(args[1]);
    unsigned long long request_id = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    if (kind < 0 || kind > 255 || PyTuple_GET_ITEM(kind_of, kind) == Py_None || request_id > 0xFFFFFFFFULL) {
        return PyLong_FromLong(-1);
    }
    PyObject *start_bytes = PyDict_GetItemWithError(args[4], (PyObject *)Py_TYPE(args[3])); /* borrowed */
    if (start_bytes == NULL) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    if (!PyBytes_Check(start_bytes) || PyBytes_GET_SIZE(start_bytes) < FRAME_OVERHEAD) {
        PyErr_SetString(PyExc_TypeError, "a frame start must be bytes with room for the frame header");
        return NULL;
    }
    Py_ssize_t start = PyByteArray_GET_SIZE(buf);
    Py_ssize_t room = PyBytes_GET_SIZE(start_bytes);
    if (PyByteArray_Resize(buf, start + room) < 0) {
        return NULL;
    }
    memcpy(PyByteArray_AS_STRING(buf) + start, PyBytes_AS_STRING(start_bytes), (size_t)room);
    PyObject *minus_one = PyLong_FromLong(-1);
    PyObject *call[3] = {args[3], buf, minus_one};
    PyObject *done = minus_one == NULL ? NULL : PyObject_Vectorcall(args[5], call, 3, NULL);
    Py_XDECREF(minus_one);
    if (done == NULL) {
        int refused = PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
                      PyErr_ExceptionMatches(PyExc_OverflowError);
        if (refused) {
            PyErr_Clear();
        }
        if (PyByteArray_GET_SIZE(buf) > start && PyByteArray_Resize(buf, start) < 0) {
            return NULL;
        }
        return refused ? PyLong_FromLong(-1) : NULL;
    }
    Py_DECREF(done);
    Py_ssize_t size = PyByteArray_GET_SIZE(buf) - start;
    if (size < FRAME_OVERHEAD || size - FRAME_OVERHEAD > 0xFFFFFFFFLL) {
        if (PyByteArray_Resize(buf, start) < 0) {
            return NULL;
        }
        return PyLong_FromLong(-1);
    }
    unsigned char *header = (unsigned char *)PyByteArray_AS_STRING(buf) + start;
    uint32_t length = (uint32_t)(size - FRAME_OVERHEAD);
    header[0] = (unsigned char)kind;
    for (int i = 0; i < 4; i++) {
        header[1 + i] = (unsigned char)(request_id >> (24 - 8 * i));
        header[5 + i] = (unsigned char)(length >> (24 - 8 * i));
    }
    return PyLong_FromSsize_t(size);
}

static PyMethodDef module_methods[] = {
    {"encode_frame_into", (PyCFunction)(void (*)(void))rc_encode_frame_into, METH_FASTCALL,
     "encode_frame_into(buf, kind, request_id, obj, frame_starts, encode_into) -> size, or -1: the reference's"},
    {"bind", (PyCFunction)(void (*)(void))rc_bind, METH_FASTCALL,
     "bind(malformed, replayed, tampered, exhausted, invalid_tag, frame_error, decode_error, kind_of, is_message)"},
    {"decode_record", (PyCFunction)(void (*)(void))rc_decode_record, METH_FASTCALL,
     "decode_record(record, max_frames, decode_fns, why) -> [(kind, request_id, value), ...]"},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m) {
    if (str_release == NULL && (str_release = PyUnicode_InternFromString("release")) == NULL) {
        return -1;
    }
    PyObject *core = PyType_FromModuleAndSpec(m, &core_spec, NULL);
    if (core == NULL) {
        return -1;
    }
    if (PyModule_AddObject(m, "RecordCore", core) < 0) {
        Py_DECREF(core);
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
    "slipstream.network._records",
    "A connection's record layer and record decoder in C; session.py and serialization.py are the reference.",
    0,
    module_methods,
    module_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__records(void) { return PyModuleDef_Init(&module_def); }
