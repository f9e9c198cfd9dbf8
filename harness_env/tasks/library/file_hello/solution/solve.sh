#!/bin/bash
set -eu
printf '%s\n' 'Hello, world!' > 'hello.txt'
