/*  status.c - names and descriptions of the status codes (see status.h).

    The codes and their descriptions are written once, in protocol/kvpool.proto (enum Status),
    from which kvpool_status.h is generated; the self test checks the generated list against
    protobuf-c's descriptor of the same enum.
*/
#include "protocol/status.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "protocol/kvpool.pb-c.h"

const char *
kvp_strerror (int status)
{
    switch (status) {
#define KVPOOL_STATUS_TEXT(name, value, text)                                                      \
    case value: return text;
        KVPOOL_STATUS_LIST (KVPOOL_STATUS_TEXT)
#undef KVPOOL_STATUS_TEXT
    }
    return "unknown status";
}

const char *
kvp_status_name (int status)
{
    switch (status) {
#define KVPOOL_STATUS_NAME(name, value, text)                                                      \
    case value: return #name + 7; /* without "KVPOOL_" */
        KVPOOL_STATUS_LIST (KVPOOL_STATUS_NAME)
#undef KVPOOL_STATUS_NAME
    }
    return "UNKNOWN";
}

void
kvp_status_test (bool verbose)
{
    //  Every C code has the same number as the proto code of the same name.
    const ProtobufCEnumDescriptor *desc = &kvpool__v1__status__descriptor;
    size_t checked = 0;
#define KVPOOL_STATUS_CHECK(name, code, text)                                                      \
    {                                                                                              \
        const ProtobufCEnumValue *v =                                                              \
            protobuf_c_enum_descriptor_get_value_by_name (desc, #name + 7);                        \
        if (!v || v->value != code) {                                                              \
            fprintf (stderr, "status %s: C %d, proto %d\n", #name, code, v ? v->value : 1);        \
            assert (false);                                                                        \
        }                                                                                          \
        assert (strcmp (kvp_strerror (code), text) == 0);                                          \
        checked++;                                                                                 \
    }
    KVPOOL_STATUS_LIST (KVPOOL_STATUS_CHECK)
#undef KVPOOL_STATUS_CHECK
    //  ... and the proto has no code C lacks.
    assert (checked == desc->n_values);
    assert (strcmp (kvp_status_name (KVPOOL_OBJECT_NOT_FOUND), "OBJECT_NOT_FOUND") == 0);
    assert (strcmp (kvp_status_name (12345), "UNKNOWN") == 0);
    assert (strcmp (kvp_strerror (12345), "unknown status") == 0);
    if (verbose)
        printf ("%zu codes checked ", checked);
}
