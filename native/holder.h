/*
 * The names of tsbox's native programs. The per-container holder (tsbox-ctr.c) is a mode of the
 * one program: run under the name tsbox-ctr (dist/bin/tsbox-ctr is a symbolic link to tsbox-shim),
 * the program is the holder. One program file means every pod's processes and every holder share
 * its pages.
 */
#ifndef TSBOX_HOLDER_H
#define TSBOX_HOLDER_H

#define HOLDER_NAME "tsbox-ctr"

/* The sandbox process of a pod without a command (native/pause.c): a program of its own, beside this one. */
#define PAUSE_NAME "tsbox-pause"

int holder_main(int argc, char **argv);

#endif
