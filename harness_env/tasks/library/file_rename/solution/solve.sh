#!/bin/bash
set -eu
mv draft.md final.md
