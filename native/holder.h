/*
 * The per-container holder (tsbox-ctr.c) is a mode of the one native program: run under the
 * name tsbox-ctr (dist/bin/tsbox-ctr is a symbolic link to tsbox-shim), the program is the holder.
 * One program file means every pod's processes and every holder share its pages.
 */
#ifndef TSBOX_HOLDER_H
#define TSBOX_HOLDER_H

#define HOLDER_NAME "tsbox-ctr"

int holder_main(int argc, char **argv);

#endif
