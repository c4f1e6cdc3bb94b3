# gen_header.awk - C headers generated from protocol/kvpool.proto, so that what the wire
# defines is written once (docs/architecture.md, "Contracts").
#
#   awk -v what=status -f protocol/gen_header.awk protocol/kvpool.proto > kvpool_status.h
#       KVPOOL_STATUS_LIST(X): X (KVPOOL_<NAME>, <value>, "<text>") for each value of
#       enum Status, in order; <text> is the comment on the value's own line.
#   awk -v what=stats -f protocol/gen_header.awk protocol/kvpool.proto > kvpool_stats.h
#       KVPOOL_STATS_FIELDS(X): X (<C type>, <name>, "<text>") for each field of message
#       Stats, in order of their numbers as written.
#   awk -v what=python -f protocol/gen_header.awk protocol/kvpool.proto > _status_text.py
#       STATUS = [("<NAME>", <value>, "<text>"), ...] (enum Status), TEXT = {<value>: "<text>"}
#       and STATS = [("<name>", "<proto type>"), ...] (message Stats): what the Python package
#       needs of the proto, as plain Python, so that it imports without protobuf.
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
function ctext(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return s }
function ctype(t) {
    if (t == "uint64") return "uint64_t"
    if (t == "uint32") return "uint32_t"
    if (t == "int64" || t == "sint64") return "int64_t"
    if (t == "int32" || t == "sint32") return "int32_t"
    if (t == "double") return "double"
    if (t == "bool") return "bool"
    print "gen_header.awk: Stats field type " t " has no C type here" > "/dev/stderr"
    exit 1
}
BEGIN {
    if (what == "python") {
        printf "\"\"\"Generated from protocol/kvpool.proto by protocol/gen_header.awk: do not edit.\"\"\"\n"
        inside = 0
        count = 0
        stats_count = 0
    }
    else {
    guard = what == "status" ? "KVPOOL_STATUS_H_INCLUDED" : "KVPOOL_STATS_H_INCLUDED"
    macro = what == "status" ? "KVPOOL_STATUS_LIST(X)" : "KVPOOL_STATS_FIELDS(X)"
    printf "/*  Generated from protocol/kvpool.proto by protocol/gen_header.awk: do not edit. */\n"
    printf "#ifndef %s\n#define %s\n\n#define %s", guard, guard, macro
    inside = 0
    count = 0
    }
}
(what == "status" || what == "python") && /^enum Status \{/ {
    inside = 1
    section = "status"
    if (what == "python")
        printf "STATUS = ["
    next
}
(what == "stats" || what == "python") && /^message Stats \{/ {
    inside = 1
    section = "stats"
    if (what == "python")
        printf "STATS = ["
    next
}
inside && /^\}/ {
    inside = 0
    if (what == "python")
        printf "\n]\n"
    next
}
inside {
    raw = $0
    line = $0
    text = ""
    if (index(line, "//")) {
        text = trim(substr(line, index(line, "//") + 2))
        line = substr(line, 1, index(line, "//") - 1)
    }
    line = trim(line)
    if (line == "") {
        # A Stats field's comment goes on under it, indented past the fields ("   //"); a
        # comment at the fields' own indent heads the fields after it.
        if (what == "stats" && pending != "" && text != "" && raw ~ /^   +\/\//)
            pending_text = pending_text " " text
        next
    }
    if (what == "python" && section == "stats") {
        # TYPE NAME = NUMBER;
        split(line, part, /[ \t=;]+/)
        printf "\n    (\"%s\", \"%s\"),", part[2], part[1]
        stats_count++
    }
    else if (what == "status" || what == "python") {
        # NAME = VALUE;
        split(line, part, /[ \t]*=[ \t]*|;/)
        name = part[1]; value = part[2]
        if (text == "")
            text = tolower(name)
        if (what == "python")
            printf "\n    (\"%s\", %s, \"%s\"),", name, value, ctext(text)
        else
            printf " \\\n    X (KVPOOL_%s, %s, \"%s\")", name, value, ctext(text)
    }
    else {
        # TYPE NAME = NUMBER;
        split(line, part, /[ \t=;]+/)
        s_flush()
        pending = sprintf(" \\\n    X (%s, %s, \"", ctype(part[1]), part[2])
        pending_text = text
    }
    count++
}
function s_flush() {
    if (pending != "")
        printf "%s%s\")", pending, ctext(pending_text)
    pending = ""
    pending_text = ""
}
END {
    s_flush()
    if (count == 0 || (what == "python" && stats_count == 0)) {
        print "gen_header.awk: nothing found for " what > "/dev/stderr"
        exit 1
    }
    if (what == "python")
        printf "TEXT = {value: text for _, value, text in STATUS}\n"
    else if (what == "status") {
        printf "\n\n/*  The codes, for C: 0 ok, negative errors. */\n"
        printf "typedef enum {\n#define KVPOOL_STATUS_ENUM(name, value, text) name = value,\n"
        printf "    KVPOOL_STATUS_LIST (KVPOOL_STATUS_ENUM)\n#undef KVPOOL_STATUS_ENUM\n"
        printf "} kvpool_status_t;\n\n#endif\n"
    }
    else
        printf "\n\n#endif\n"
}
