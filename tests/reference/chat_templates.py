"""The chat templates of the families' published tokenizer_config.json files (Llama 3:
Meta-Llama-3-8B-Instruct, Llama 2: Llama-2-7b-chat-hf, Mistral: Mistral-7B-Instruct-v0.2, Qwen2:
Qwen2-7B-Instruct, Zephyr: zephyr-7b-beta), for the chat template and prepare tests."""

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content "
          "%}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
          "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
          "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
          "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation"
          " roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
          "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
          "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
          "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
          "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
           "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
           "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
           "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
           "user and assistant roles are supported!') }}{% endif %}{% endfor %}")
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
          "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
          "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
          "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}"
          "\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
          "{% endfor %}")
